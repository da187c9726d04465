// What the device remembers per operator signature (its meta results, its scratch and cost),
// in a bounded map. Internal to remat::torch.
#ifndef REMAT_PYTORCH_DETAIL_SIGNATURE_CACHE_H_
#define REMAT_PYTORCH_DETAIL_SIGNATURE_CACHE_H_

#include <absl/container/flat_hash_map.h>

#include <cstddef>
#include <string>
#include <utility>

namespace remat::torch_backend::detail {

// Note [Signatures forgotten]
// A signature names an operator with its arguments' shapes, so a program whose shapes change
// (a sequence length per batch) makes new ones without end, and a map of them would grow
// with the run. The cache keeps two generations of at most `generation` entries each: a new
// entry goes to the young one, an entry found in the old one moves to the young one, and
// when the young one is full it becomes the old one and the old one is dropped. So it holds
// at most twice `generation` entries, and what a program uses within `generation` new
// signatures is never forgotten. A forgotten signature costs what a new one does: its meta
// kernel runs again, its scratch and cost are measured again.
template <typename Value>
class SignatureCache {
 public:
  explicit SignatureCache(std::size_t generation) : generation_(generation) {}

  // The entry, or null. Valid until the next call that may insert.
  Value* find(const std::string& key) {
    if (auto it = young_.find(key); it != young_.end()) return &it->second;
    auto it = old_.find(key);
    if (it == old_.end()) return nullptr;
    Value v = std::move(it->second);
    old_.erase(it);
    return &insert(key, std::move(v));
  }
  Value& operator[](const std::string& key) {
    if (Value* v = find(key)) return *v;
    return insert(key, Value{});
  }
  void insert_or_assign(const std::string& key, Value v) { (*this)[key] = std::move(v); }
  std::size_t size() const { return young_.size() + old_.size(); }
  std::size_t forgotten() const { return forgotten_; }

 private:
  Value& insert(const std::string& key, Value v) {
    if (young_.size() >= generation_) {
      forgotten_ += old_.size();
      old_ = std::move(young_);
      young_.clear();
    }
    return young_.insert_or_assign(key, std::move(v)).first->second;
  }

  std::size_t generation_;
  std::size_t forgotten_ = 0;
  absl::flat_hash_map<std::string, Value> young_, old_;
};

}  // namespace remat::torch_backend::detail

#endif  // REMAT_PYTORCH_DETAIL_SIGNATURE_CACHE_H_
