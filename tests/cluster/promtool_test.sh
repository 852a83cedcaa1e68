#!/usr/bin/env bash
# promtool on the shipped rule files: they load (check rules) and their unit tests pass (test rules).
#   promtool_test.sh RULES_TEST.yml RULE_FILE...
set -uo pipefail
command -v promtool >/dev/null || { echo "SKIP: promtool not installed (Debian package prometheus)"; exit 77; }
test_file=$1; shift
promtool check rules "$@" || exit 1
promtool test rules "$test_file"
