#!/bin/sh
# README lists every variable of the one table (stagelink_info -c).
# Usage: check_readme_env.sh STAGELINK_INFO README.md
set -eu
missing=0
for name in $("$1" -m | sed -n 's/^| `\([A-Z_]*\)`.*/\1/p'); do
    if ! grep -q "\`$name\`" "$2"; then
        echo "README.md does not list $name"
        missing=1
    fi
done
exit $missing
