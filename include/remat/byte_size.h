// remat/byte_size.h: byte counts as people write them, for budgets read from a command line,
// a config file or the environment.
//
//   absl::StatusOr<std::uint64_t> b = remat::parse_byte_size("1.5GiB");   // 1610612736
//   if (!b.ok()) std::cerr << b.status().message() << "\n";
//   std::string s = remat::format_byte_size(*b);                        // "1.50 GiB"
#ifndef REMAT_BYTE_SIZE_H_
#define REMAT_BYTE_SIZE_H_

#include <absl/status/statusor.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace remat {

// The largest size accepted: the planners count bytes in int64_t.
inline constexpr std::uint64_t kMaxByteSize = std::uint64_t{1} << 62;

// "1234", "1234B", "512KiB", "1.5GiB", "2GB", "300kB", "40 MiB": SI units (kB, MB, GB, TB) are
// powers of 1000, IEC units (KiB, MiB, GiB, TiB) powers of 1024; fractions of a byte round
// down. An error for anything else (negative, not a number, inf, nan, over kMaxByteSize),
// worded "'TEXT' is not a WHAT: why".
absl::StatusOr<std::uint64_t> parse_byte_size(std::string_view text,
                                              std::string_view what = "byte size");

// Bytes in the largest IEC unit that keeps the number at least 1: "512 B", "227.00 MiB".
std::string format_byte_size(std::uint64_t bytes);

}  // namespace remat

#endif  // REMAT_BYTE_SIZE_H_
