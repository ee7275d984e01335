#!/usr/bin/env bash
# The modules' layering, as the build enforces it (CMakeLists.txt, swapnet_module): with one
# module's include directories, its own public header compiles and every header it must not see
# (a module above it, another module's src/, libtorch below assembly) is not found.
#   layering_test.sh CXX "DIR;DIR;..." OWN_HEADER FORBIDDEN_HEADER...
set -euo pipefail
cxx=$1 dirs=$2 own=$3
shift 3
flags=(-std=c++17 -fsyntax-only -x c++ -)
IFS=';' read -r -a list <<< "$dirs"
for d in "${list[@]}"; do flags+=(-I "$d"); done
if ! err=$(printf '#include "%s"\n' "$own" | "$cxx" "${flags[@]}" 2>&1); then
  echo "layering: the module's own header $own does not compile with its include directories:"
  echo "$err" | head -5
  exit 1
fi
bad=0
for h in "$@"; do
  if err=$(printf '#include "%s"\n' "$h" | "$cxx" "${flags[@]}" 2>&1); then
    echo "layering: $h is visible here and must not be"
    bad=1
  elif ! grep -q "No such file" <<< "$err"; then
    echo "layering: $h failed for another reason than not being found:"
    echo "$err" | head -3
    bad=1
  else
    echo "layering: $h not visible (as it must be)"
  fi
done
exit $bad
