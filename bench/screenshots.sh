#!/bin/bash
# screenshots.sh: regenerates the README's pictures from a live server on the repository's demo model:
#   docs/img/dashboard.png  the dashboard in chromium under a tight-budget mix (the browser test,
#                           tests/server/dashboard.test.mjs, with 45 s of load before the picture)
#   docs/img/top.png, .txt  `headroom top` in tmux under load (tests/server/top_tmux.sh), the captured
#                           screen drawn by chromium (bench/ansi_png.mjs) and kept as text
# usage: bench/screenshots.sh [BUILD_DIR]   (default: build; needs node, npm, /usr/bin/chromium, tmux)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
bin=$build/headroom
model=$root/models/stories260K-q8_0.gguf
img=$root/docs/img
scratch=$build/node-playwright
[ -x "$bin" ] || { echo "screenshots.sh: $bin is not built (cmake --build $build --target headroom)" >&2; exit 2; }
mkdir -p "$img"
HR_DASH_SECONDS=${HR_DASH_SECONDS:-45} node "$root/tests/server/dashboard.test.mjs" "$bin" "$scratch" "$model" \
    "$img/dashboard.png"
"$root/tests/server/top_tmux.sh" "$bin" "$model" "$img/top.txt"
node "$root/bench/ansi_png.mjs" "$scratch" "$img/top.ansi" "$img/top.png"
rm -f "$img/top.ansi"
echo "screenshots.sh: $img/dashboard.png, $img/top.png, $img/top.txt"
