#!/bin/sh
# docs/configuration.md lists every variable of the one table (stagelink_info -m); a table
# that yields no variable at all is a failure, not a pass.
# Usage: check_env_doc.sh STAGELINK_INFO docs/configuration.md
set -eu
table=$("$1" -m) || { echo "$1 -m failed"; exit 1; }
missing=0 checked=0
for name in $(printf '%s\n' "$table" | sed -n 's/^| `\([A-Z_]*\)`.*/\1/p'); do
    checked=$((checked + 1))
    if ! grep -q "\`$name\`" "$2"; then
        echo "$2 does not list $name"
        missing=1
    fi
done
if [ "$checked" -eq 0 ]; then
    echo "no variable found in the table of $1 -m: nothing was checked"
    exit 1
fi
echo "$checked variables checked"
exit $missing
