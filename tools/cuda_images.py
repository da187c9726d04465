#!/usr/bin/env python3
"""Lists the GPU code images (machine code for an sm_XX, or PTX) that nvcc embedded in object
files or static libraries, by reading their .nv_fatbin sections: a check, without cuobjdump,
that a build carries code for the architectures it should.

  python3 tools/cuda_images.py build/lib/libremat_kernels_cuda.a
"""
import argparse
import os
import struct
import subprocess
import sys
import tempfile

FATBIN_MAGIC = 0xBA55ED50
KINDS = {1: "PTX", 2: "ELF"}


def images(fatbin):
    """Yields (kind, arch) for each entry of a fatbin blob."""
    off = 0
    while off + 16 <= len(fatbin):
        magic, _version, header, size = struct.unpack_from("<IHHQ", fatbin, off)
        if magic != FATBIN_MAGIC:
            break
        p, end = off + header, off + header + size
        while p + 32 <= end:
            kind, _ever, entry_header, payload = struct.unpack_from("<HHIQ", fatbin, p)
            arch = struct.unpack_from("<I", fatbin, p + 28)[0]
            yield KINDS.get(kind, str(kind)), f"sm_{arch}"
            p += entry_header + payload
        off = end


def fatbin_of(obj):
    with tempfile.NamedTemporaryFile() as out:
        r = subprocess.run(["objcopy", f"--dump-section=.nv_fatbin={out.name}", obj, "/dev/null"],
                           capture_output=True)
        return open(out.name, "rb").read() if r.returncode == 0 else b""


def objects(path):
    if not path.endswith(".a"):
        return [path]
    tmp = tempfile.mkdtemp()
    subprocess.run(["ar", "x", os.path.abspath(path)], cwd=tmp, check=True)
    return [os.path.join(tmp, f) for f in sorted(os.listdir(tmp))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="object files or static libraries")
    args = parser.parse_args()
    found = set()
    for path in args.files:
        if not os.path.exists(path):
            sys.exit(f"cuda_images: {path}: no such file")
        for obj in objects(path):
            for kind, arch in images(fatbin_of(obj)):
                found.add((kind, arch))
                print(f"{os.path.basename(obj)}: {kind} {arch}")
    print("images:", ", ".join(f"{k} {a}" for k, a in sorted(found, key=lambda x: (x[1], x[0]))))
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
