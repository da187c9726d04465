#!/usr/bin/env python3
"""Checks the layering and the size rules the build does not enforce by itself.

  python3 tools/check_layering.py BUILD_DIR

Reads the targets, their sources and their dependencies from CMake's file API (configuring
BUILD_DIR again with a codemodel query), then fails, listing each violation, when
  - a file includes a header of a component (a library target) that its own target does not
    link, directly or through others; a header belongs to the library whose source of the
    same name sits beside it, a public header (include/remat/X.h) to the library with a
    source X.cc, or to the owner PUBLIC_HEADERS names, and any other header (an internal or
    detail/ one) to the one library with sources in its folder or the nearest above
    (SELF_CONTAINED lists header-only files any target may include);
  - a non-test source in runtime/, planner/, kernels/ or pytorch/ passes 700 lines, or a
    function in one passes 60, unless EXCEPTIONS lists it with its reason.
Exit status: 0 clean, 1 violations, 2 bad usage.
"""
import glob
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 60
SIZE_CHECKED = ("runtime/", "planner/", "kernels/", "pytorch/")

# Public headers whose implementation has another name, and header-only ones.
PUBLIC_HEADERS = {
    "include/remat/op.h": "remat_core",
    "include/remat/timeline.h": "remat_core",
    "include/remat/system_cuda.h": "remat_cuda",
    "include/remat/tensor.h": "remat_core",
    "include/remat/runtime.h": "remat_core",
    "include/remat/cuda_api.h": "remat_alloc",  # the interface; remat_cuda implements it
    "include/remat/memory_resource.h": "remat_alloc",
    "include/remat/errors.h": "remat_alloc",
    "include/remat/logical_memory.h": "remat_alloc",
    "include/remat/segment_source.h": "remat_alloc",
    "include/remat/caching_allocator.h": "remat_alloc",
    "include/remat/placement.h": "remat_alloc",
    "include/remat/dtr_trace.h": "remat_ir",
    "include/remat/hints.h": "remat_ir",
    "include/remat/byte_size.h": "remat_ir",
    "include/remat/replay.h": "remat_trace",
    "include/remat/step_driver.h": "remat_driver",
}

# Includes the scan reports that the preprocessor never sees, by (file, target).
# Header-only files that include nothing of the project: any target may include them.
SELF_CONTAINED = {
    "kernels/philox.h":
        "the Philox generator (standard headers only), shared by the CPU and CUDA kernels and "
        "their tests",
}

LAYERING_EXCEPTIONS = {
    ("kernels/cuda/cuda_kernels_test.cc", "cuda_kernels_host_test"):
        "includes remat/system_cuda.h only without REMAT_CUDA_HOST_EXECUTION (the device build, "
        "which links remat::cuda)",
}

# Files and functions over the size limits, each with its reason. A function is named
# "path:name" as the scan reports it.
EXCEPTIONS = {
}


def codemodel(build):
    """The targets of BUILD_DIR: name -> (type, sources, dependency names)."""
    query = os.path.join(build, ".cmake", "api", "v1", "query")
    os.makedirs(query, exist_ok=True)
    open(os.path.join(query, "codemodel-v2"), "a").close()
    subprocess.run(["cmake", build], check=True, stdout=subprocess.DEVNULL)
    reply = os.path.join(build, ".cmake", "api", "v1", "reply")
    index = json.load(open(sorted(glob.glob(os.path.join(reply, "index-*.json")))[-1]))
    model = next(o for o in index["objects"] if o["kind"] == "codemodel")
    config = json.load(open(os.path.join(reply, model["jsonFile"])))["configurations"][0]
    targets = {}
    for t in config["targets"]:
        j = json.load(open(os.path.join(reply, t["jsonFile"])))
        sources = [s["path"] for s in j.get("sources", []) if not os.path.isabs(s["path"])]
        deps = {d["id"].split("::")[0] for d in j.get("dependencies", [])}
        targets[j["name"]] = (j["type"], sources, deps)
    return targets


def header_owners(targets):
    """Header path -> the library target it belongs to."""
    owners = dict(PUBLIC_HEADERS)
    by_stem = {}
    for name, (kind, sources, _) in targets.items():
        if not kind.endswith("LIBRARY"):
            continue
        for src in sources:
            stem, ext = os.path.splitext(src)
            if ext not in (".cc", ".cu"):
                continue
            owners.setdefault(stem + ".h", name)
            by_stem.setdefault(os.path.basename(stem), set()).add(name)
    for path in glob.glob(os.path.join(ROOT, "include", "remat", "*.h")):
        rel = os.path.relpath(path, ROOT)
        stem = os.path.splitext(os.path.basename(rel))[0]
        if rel not in owners and len(by_stem.get(stem, ())) == 1:
            owners[rel] = next(iter(by_stem[stem]))
    return owners


INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def resolve(include):
    for candidate in (include, os.path.join("include", include)):
        if os.path.isfile(os.path.join(ROOT, candidate)):
            return os.path.normpath(candidate)
    return None


def directory_owners(targets):
    """Directory -> the library targets with a source file directly in it."""
    dirs = {}
    for name, (kind, sources, _) in targets.items():
        if not kind.endswith("LIBRARY"):
            continue
        for src in sources:
            dirs.setdefault(os.path.dirname(src), set()).add(name)
    return dirs


def folder_owner(header, dirs):
    """The library of a header with no source of its own (a detail/ header, an internal one):
    the one target with sources in its folder or the nearest folder above; None where that
    folder holds sources of several targets, or none does."""
    d = os.path.dirname(header)
    while d and not d.startswith("include"):
        owners = dirs.get(d)
        if owners:
            return next(iter(owners)) if len(owners) == 1 else None
        d = os.path.dirname(d)
    return None


def layering_violations(targets, owners):
    out = []
    dirs = directory_owners(targets)
    files = {}  # file -> the targets it is compiled into, or the owner of a header
    for name, (kind, sources, _) in targets.items():
        for src in sources:
            files.setdefault(src, set()).add(name)
    for header, owner in owners.items():
        files.setdefault(header, set()).add(owner)
    for path, users in sorted(files.items()):
        full = os.path.join(ROOT, path)
        if not os.path.isfile(full):
            continue
        for inc in INCLUDE.findall(open(full, errors="replace").read()):
            header = resolve(inc)
            # Sources compiled into another target (the CUDA kernels' host execution includes
            # the .cu files) and self-contained headers carry no link.
            if header is None or not header.endswith((".h", ".cuh")) or header in SELF_CONTAINED:
                continue
            owner = owners.get(header) or folder_owner(header, dirs)
            if owner is None:
                continue
            for user in sorted(users):
                if (path, user) in LAYERING_EXCEPTIONS:
                    continue
                if owner != user and owner not in targets[user][2]:
                    out.append(f"{path} (target {user}) includes {header} of {owner}, "
                               f"which {user} does not link")
    return out


FUNCTION_NAME = re.compile(r"([~\w:]+(?:<[^<>]*>)?|operator\S+)\s*\(")
CONTAINER = re.compile(r"\b(namespace|class|struct|union|enum)\b|extern\s*\"C\"|=\s*$")


def strip_code(text):
    """Comments, strings and character literals blanked, line breaks kept."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r'R"\((.*?)\)"', lambda m: '""' + "\n" * m.group(0).count("\n"), text,
                  flags=re.S)
    text = re.sub(r'"(\\.|[^"\\\n])*"', '""', text)
    return re.sub(r"'(\\.|[^'\\\n])*'", "''", text)


def long_functions(path):
    """(name, lines) of each function body over the limit: a brace block that opens outside
    any other function and is no namespace, class or initializer."""
    text = strip_code(open(os.path.join(ROOT, path), errors="replace").read())
    out, stack, head, line = [], [], "", 1
    for ch in text:
        if ch == "\n":
            line += 1
        if ch == "{":
            in_function = any(kind == "function" for kind, _, _ in stack)
            if in_function or CONTAINER.search(head.strip()) or "(" not in head:
                stack.append(("block", line, ""))
            else:
                names = FUNCTION_NAME.findall(head)
                stack.append(("function", line, names[0] if names else "?"))
            head = ""
        elif ch == "}":
            if stack:
                kind, start, name = stack.pop()
                if kind == "function" and line - start + 1 > MAX_FUNCTION_LINES:
                    out.append((name, line - start + 1))
            head = ""
        elif ch == ";":
            head = ""
        else:
            head += ch
    return out


def size_violations():
    out = []
    for top in SIZE_CHECKED:
        for full in sorted(glob.glob(os.path.join(ROOT, top, "**", "*"), recursive=True)):
            path = os.path.relpath(full, ROOT)
            if not path.endswith((".cc", ".h", ".cu")) or "_test" in os.path.basename(path):
                continue
            if "/testing/" in path or path.startswith("kernels/cuda/host/include/"):
                continue
            lines = open(full, errors="replace").read().count("\n")
            if lines > MAX_FILE_LINES and path not in EXCEPTIONS:
                out.append(f"{path}: {lines} lines (at most {MAX_FILE_LINES})")
            for name, n in long_functions(path):
                key = f"{path}:{name}"
                if key not in EXCEPTIONS and path not in EXCEPTIONS:
                    out.append(f"{key}: a function of {n} lines (at most {MAX_FUNCTION_LINES})")
    return out


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) == 2 else 2
    targets = codemodel(os.path.abspath(argv[1]))
    violations = layering_violations(targets, header_owners(targets)) + size_violations()
    for v in violations:
        print(f"check_layering: {v}")
    if violations:
        print(f"check_layering: {len(violations)} violations")
        return 1
    print(f"check_layering: {len(targets)} targets, no violations")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
