# Shared set-up of the GPU verification scripts (sourced; run from the repo root on the GPU host
# with the release artifacts in .gpu/main). Logs and reports go to $OUT.
set -uo pipefail
export PATH=$PWD/.gpu/main:$PATH PYTHONUNBUFFERED=1
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/qscache} QUANTSHADOW_COMPILE=sync QUANTSHADOW_LOG=${QUANTSHADOW_LOG:-info}
OUT=${OUT:-/tmp/qsout}
mkdir -p "$OUT"
# same A.json B.json: "identical" when two output digests agree (timings aside), else the keys.
same() { python3 - "$1" "$2" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
bad = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k) and not k.endswith("tok_s")]
print("identical" if not bad else f"DIFFERENT: {bad[:10]}")
sys.exit(1 if bad else 0)
PY
}
