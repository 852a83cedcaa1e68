# Sourced by the house tests: expect_refused FILE TEXT NEEDLE writes TEXT into $tmp/FILE, runs
# the check ($check) on $tmp, and fails unless the check refuses it with a message holding NEEDLE;
# then removes FILE again.
expect_refused() {
  mkdir -p "$(dirname "$tmp/$1")"; printf '%s\n' "$2" > "$tmp/$1"
  if out=$(python3 "$check" --root "$tmp"); then echo "FAIL: $1 ($2) passed the check"; exit 1; fi
  grep -qF -- "$3" <<<"$out" || { echo "FAIL: message for $1 lacks '$3':"; echo "$out"; exit 1; }
  rm "$tmp/$1"
}
