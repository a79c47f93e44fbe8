#!/bin/bash
# lint.sh: the Kubernetes example checked with yamllint (Debian's yamllint); exits 77 without it.
# Syntax and style only: nothing here talks to a cluster.
command -v yamllint > /dev/null || { echo "SKIP: yamllint is absent (apt-get install yamllint)"; exit 77; }
cd "$(dirname "$0")" && yamllint -s -d '{extends: default, rules: {line-length: {max: 110}, comments: {min-spaces-from-content: 2}}}' ./*.yaml
