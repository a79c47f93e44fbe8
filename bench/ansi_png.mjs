// ansi_png.mjs: draws a terminal capture (tmux capture-pane -e: text with SGR colour escapes) as a
// PNG in chromium, for the README's picture of `headroom top`. Used by bench/screenshots.sh:
//   node ansi_png.mjs SCRATCH_DIR (with playwright-core) IN.ansi OUT.png
import { readFileSync, mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';

const [scratch, input, output] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(scratch), 'package.json'));
const { chromium } = require('playwright-core');

// the 8 colours as a dark terminal theme shows them
const fg = ['#1e1e1e', '#ef4444', '#22c55e', '#eab308', '#60a5fa', '#c084fc', '#2dd4bf', '#e5e7eb'];
const esc = (s) => s.replace(/[&<>]/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;' }[c]));
let text = readFileSync(input, 'utf8').replace(/\s+$/, '');
let html = '', style = {};
const open = () => {
  const css = [];
  if (style.bold) css.push('font-weight:bold');
  if (style.dim) css.push('opacity:.6');
  let color = style.fg !== undefined ? fg[style.fg] : null;
  if (style.rev) css.push(`background:${color || '#d1d5db'};color:#111827`);
  else if (color) css.push(`color:${color}`);
  return css.length ? `<span style="${css.join(';')}">` : '<span>';
};
html += open();
for (const part of text.split(/(\x1b\[[0-9;]*[A-Za-z])/)) {
  const m = part.match(/^\x1b\[([0-9;]*)([A-Za-z])$/);
  if (!m) { html += esc(part); continue; }
  if (m[2] !== 'm') continue; // cursor and erase sequences draw nothing here
  for (const code of (m[1] || '0').split(';').map(Number)) {
    if (code === 0) style = {};
    else if (code === 1) style.bold = true;
    else if (code === 2) style.dim = true;
    else if (code === 7) style.rev = true;
    else if (code >= 30 && code <= 37) style.fg = code - 30;
    else if (code === 39) delete style.fg;
    else if (code === 22) { delete style.bold; delete style.dim; }
    else if (code === 27) delete style.rev;
  }
  html += '</span>' + open();
}
html += '</span>';
const page = `<!doctype html><meta charset="utf-8"><body style="margin:0;background:#0f1419">
<pre id="t" style="display:inline-block;margin:0;padding:14px 18px;color:#d8dee6;background:#0f1419;
font:13px/1.3 'DejaVu Sans Mono',monospace">${html}</pre></body>`;
const profile = mkdtempSync(path.join(os.tmpdir(), 'headroom-chromium-'));
const ctx = await chromium.launchPersistentContext(profile, {
  executablePath: '/usr/bin/chromium', headless: true,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
         '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const p = await ctx.newPage();
await p.setContent(page);
await (await p.$('#t')).screenshot({ path: output });
await ctx.close();
rmSync(profile, { recursive: true, force: true });
console.log(`wrote ${output}`);
