#!/bin/sh
# asm_round_trip.sh NPURT DIR: every image file in DIR, listed by `npurt disasm` and
# assembled back by `npurt asm`, gives the same bytes; and an edited listing
# assembles to an image whose listing shows the edit. Prints "asm_round_trip: ok".
set -e
npurt="$1"
dir="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
n=0
for img in "$dir"/*.img; do
  "$npurt" disasm "$img" >"$work/listing.s"
  "$npurt" asm "$work/listing.s" -o "$work/back.img"
  cmp "$img" "$work/back.img"
  n=$((n + 1))
done
[ "$n" -gt 0 ] || { echo "asm_round_trip: no images in $dir"; exit 1; }

# An edit: copy.img's row stride of 64 becomes 32.
"$npurt" disasm "$dir/copy.img" | sed 's/li r2, 64$/li r2, 32/' >"$work/edited.s"
"$npurt" asm "$work/edited.s" -o "$work/edited.img"
"$npurt" disasm "$work/edited.img" | grep -q "li r2, 32$"
if cmp -s "$dir/copy.img" "$work/edited.img"; then
  echo "asm_round_trip: the edit did not change the image"
  exit 1
fi
echo "asm_round_trip: ok ($n images)"
