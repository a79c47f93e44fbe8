// dashboard.test.mjs: the dashboard (GET /) in a real browser: Debian's chromium driven by
// playwright-core from npm. Run by ctest when node exists:
//   node dashboard.test.mjs HEADROOM_BIN SCRATCH_DIR [MODEL.gguf] [SCREENSHOT.png]
// Installs chromium with apt-get when root and absent, and playwright-core into SCRATCH_DIR; exits 77
// (skipped) with the reason only when the browser cannot start or npm cannot install. It starts a
// server on a tight KV budget, sends a mix (long generations, requests sharing a prompt prefix, a
// windowed one that evicts, and two that are refused), and checks that what the page renders equals
// the /v1/kv answer it rendered from (row count, bytes held, the pool's used bytes, each row's
// bytes), that preemption, refusal and eviction markers appear, that there are no console errors,
// that the API key form works, and that a server that goes away turns into "disconnected,
// retrying". It saves a screenshot. Every wait is bounded.
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';

const [bin, scratch, model, shot] = process.argv.slice(2);
const CHROMIUM = '/usr/bin/chromium';
let failed = 0, passed = 0;
const check = (cond, what) => { if (cond) passed++; else { failed++; console.error(`CHECK failed: ${what}`); } };
const skip = (why) => { console.log(`SKIP: ${why}`); process.exit(77); };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

if (!existsSync(CHROMIUM) && process.getuid && process.getuid() === 0) {
  const apt = (args) => execFileSync('apt-get', args, { stdio: 'pipe', timeout: 400000,
                                                       env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' } });
  try {
    try { apt(['install', '-y', '--no-install-recommends', 'chromium']); } catch {
      apt(['update']); // a fresh machine's package lists may not know it yet
      apt(['install', '-y', '--no-install-recommends', 'chromium']);
    }
  } catch (e) {
    console.log(`apt-get install chromium failed: ${String(e.stderr || e.message).split('\n')[0]}`);
  }
}
if (!existsSync(CHROMIUM)) skip(`${CHROMIUM} is absent (apt-get install chromium, as root)`);

mkdirSync(scratch, { recursive: true });
if (!existsSync(path.join(scratch, 'node_modules', 'playwright-core'))) {
  try {
    execFileSync('npm', ['install', '--prefix', scratch, '--no-audit', '--no-fund', 'playwright-core@1'],
                 { stdio: 'pipe', timeout: 180000 });
  } catch (e) {
    skip(`npm could not install playwright-core (${String(e.stderr || e.message).split('\n')[0]})`);
  }
}
const require = createRequire(path.join(path.resolve(scratch), 'package.json'));
const { chromium } = require('playwright-core');

// ---- the server: a pool of 640 tokens for prompts of ~60 and generations of up to 300 -----------
const KEY = 'dash-key';
const args = ['serve', '--port', '0', '--api-key', KEY, '--drain-timeout', '1', '-t', '1',
              '--kv-budget', '400KiB', '--admission', 'optimistic', '--max-queue', '256'];
if (model && existsSync(model)) args.push('-m', model);
const srv = spawn(bin, args, { stdio: ['ignore', 'pipe', 'inherit'] });
let srvExited = false;
srv.on('exit', () => { srvExited = true; });
const watchdog = setTimeout(() => { console.error('watchdog: 480 s'); srv.kill('SIGKILL'); process.exit(1); }, 480000);
const port = await new Promise((resolve, reject) => {
  let out = '';
  srv.stdout.on('data', (d) => {
    out += d;
    const m = out.match(/listening on \S+:(\d+)/);
    if (m) resolve(Number(m[1]));
  });
  srv.on('exit', (code) => reject(new Error(`headroom serve exited ${code}: ${out}`)));
});
const base = `http://127.0.0.1:${port}`;
const auth = { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' };

// ---- the browser ---------------------------------------------------------------------------------
const profile = mkdtempSync(path.join(os.tmpdir(), 'headroom-chromium-'));
let ctx;
try {
  // a fresh profile (--user-data-dir) per run: playwright passes it through launchPersistentContext
  ctx = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM, headless: true, timeout: 60000, viewport: { width: 1400, height: 1000 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
           '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
} catch (e) {
  srv.kill('SIGKILL');
  rmSync(profile, { recursive: true, force: true });
  skip(`chromium cannot start: ${String(e.message).split('\n')[0]}`);
}
const page = await ctx.newPage();
const consoleErrors = [];
page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
page.on('pageerror', (e) => consoleErrors.push(`page error: ${e.message}`));
const answers = new Map(); // snapshot -> the /v1/kv answer the page received
page.on('response', async (r) => {
  if (!r.url().endsWith('/v1/kv') || r.status() !== 200) return;
  try { const d = await r.json(); answers.set(d.snapshot, d); } catch { /* the page went away */ }
});
await page.addInitScript((k) => sessionStorage.setItem('headroom-key', k), KEY);
const html = await fetch(`${base}/`);
check(html.status === 200 && /text\/html/.test(html.headers.get('content-type')), 'GET / is the page');
check((await fetch(`${base}/dashboard`)).status === 200, 'GET /dashboard is the page');
await page.goto(`${base}/`);
await page.waitForFunction(() => document.body.dataset.snapshot !== '0', null, { timeout: 30000 });
check((await page.textContent('#status')) === 'live', 'the page is live');

// ---- the mix ---------------------------------------------------------------------------------------
const prefix = 'Once upon a time there was a little girl named Lily who loved to play in the park with her dog';
const send = (prompt, max_tokens, extra = {}) =>
  fetch(`${base}/v1/completions`, { method: 'POST', headers: auth,
    body: JSON.stringify({ prompt, max_tokens, temperature: 0.8, ignore_eos: true, ...extra }) })
    .then((r) => r.status).catch(() => 0);
let sending = true;
const load = (async () => {
  const statuses = [];
  for (let wave = 0; sending && wave < 400; wave++) {
    const batch = [];
    for (let i = 0; i < 4; i++) batch.push(send('The big brown bear', 300));                 // long
    for (let i = 0; i < 8; i++) batch.push(send(`${prefix} and her friend number ${i}`, 60)); // shared prefix
    if (wave % 4 === 0) batch.push(send('The little dog', 200, { kv_policy: 'window:32' }));   // evicts
    statuses.push(...await Promise.all(batch));
    if (wave % 4 === 3) await sleep(1500); // quiet spells, so the pool drains and refills on the chart
  }
  return statuses;
})();
// refusals: a prompt past the context, and a wrong key
const long = 'word '.repeat(2000);
check((await send(long, 4)) === 400, 'a prompt past the context is refused');
check((await fetch(`${base}/v1/kv`, { headers: { Authorization: 'Bearer wrong' } })).status === 401, 'wrong key: 401');

// ---- what the page shows equals the /v1/kv answer it rendered ------------------------------------
let compared = 0, withRows = 0, preemptSeen = false;
const t0 = Date.now();
while (Date.now() - t0 < 90000 && (withRows < 3 || !preemptSeen)) {
  await sleep(300);
  const v = await page.evaluate(() => {
    const n = document.getElementById('nreq');
    return {
      snapshot: Number(document.body.dataset.snapshot),
      count: Number(n.dataset.count), bytes: Number(n.dataset.bytes),
      used: Number(document.getElementById('pool-used').dataset.bytes),
      preemptions: Number(document.getElementById('pool-preemptions').dataset.count),
      rows: [...document.querySelectorAll('#reqs tbody tr')].map((tr) => [Number(tr.dataset.request), Number(tr.dataset.bytes)]),
      markers: document.querySelectorAll('#events [data-kind^="preempt"]').length,
    };
  });
  const d = answers.get(v.snapshot);
  if (!d) continue;
  compared++;
  const sum = d.requests.reduce((s, r) => s + r.held_bytes, 0);
  check(v.count === d.requests.length, `snapshot ${v.snapshot}: ${v.count} requests shown, /v1/kv has ${d.requests.length}`);
  check(v.bytes === sum, `snapshot ${v.snapshot}: ${v.bytes} bytes shown, /v1/kv rows hold ${sum}`);
  check(v.used === d.pool.used_bytes, `snapshot ${v.snapshot}: pool used ${v.used} shown, /v1/kv ${d.pool.used_bytes}`);
  check(v.preemptions === d.pool.preemptions, `snapshot ${v.snapshot}: preemptions`);
  check(v.rows.length === Math.min(50, d.requests.length), `snapshot ${v.snapshot}: ${v.rows.length} table rows`);
  const byId = new Map(d.requests.map((r) => [r.request_id, r.held_bytes]));
  check(v.rows.every(([id, b]) => byId.get(id) === b), `snapshot ${v.snapshot}: every row's bytes are its /v1/kv bytes`);
  check(v.rows.every((r, i) => i === 0 || v.rows[i - 1][1] >= r[1]), `snapshot ${v.snapshot}: rows sorted by bytes`);
  if (d.requests.length >= 3) withRows++;
  if (v.markers > 0 && d.pool.preemptions > 0) preemptSeen = true;
}
check(compared >= 3 && withRows >= 3, `compared ${compared} snapshots, ${withRows} with 3+ requests`);
check(preemptSeen, 'a preemption marker appears');
const refusalShown = await page.waitForFunction(() => Number(document.getElementById('events').dataset.refusals) >= 2,
                                                null, { timeout: 10000 }).then(() => true, () => false);
check(refusalShown, 'both refusals (context, key) are among the events the chart marks');
const evictShown = await page.waitForFunction(() => Number(document.getElementById('events').dataset.evictions) > 0,
                                              null, { timeout: 20000 }).then(() => true, () => false);
check(evictShown, 'a window policy\'s evictions are among the events the chart marks');
// HR_DASH_SECONDS: keep the load going this long first (bench/screenshots.sh: a fuller chart)
const hold = Number(process.env.HR_DASH_SECONDS || 0);
for (const t1 = Date.now(); Date.now() - t1 < Math.min(hold, 180) * 1000;) await sleep(500);
if (shot) {
  // a picture with requests in it (the mix has quiet spells): wait for three rows, bounded
  await page.waitForFunction(() => Number(document.getElementById('nreq').dataset.count) >= 3, null,
                             { timeout: 20000 }).catch(() => {});
  mkdirSync(path.dirname(shot), { recursive: true });
  await page.screenshot({ path: shot });
  console.log(`screenshot: ${shot}`);
}
sending = false;
const statuses = await load;
check(statuses.length > 0 && statuses.every((s) => s === 200), `the mix answered 200 (${statuses.length} requests)`);
check(consoleErrors.length === 0, `no console errors (${consoleErrors.join(' | ')})`);

// ---- without the key: the page asks for it ---------------------------------------------------------
const p2 = await ctx.newPage();
await p2.addInitScript(() => sessionStorage.removeItem('headroom-key'));
const p2errors = [];
p2.on('pageerror', (e) => p2errors.push(e.message));
await p2.goto(`${base}/dashboard`);
await p2.waitForSelector('#keyform', { state: 'visible', timeout: 15000 });
check((await p2.textContent('#status')) === 'API key needed', 'without a key the page asks for one');
await p2.fill('#key', KEY);
await p2.click('#keyform button');
await p2.waitForFunction(() => document.getElementById('status').textContent === 'live', null, { timeout: 15000 });
check(true, 'with the key typed in, the page goes live');
check(p2errors.length === 0, `no page errors on the key form (${p2errors.join(' | ')})`);
await p2.close();

// ---- the server goes away: "disconnected, retrying", the last picture stays -------------------------
srv.kill('SIGTERM');
await new Promise((resolve) => (srvExited ? resolve() : srv.on('exit', resolve)));
const down = await page.waitForFunction(() => document.getElementById('status').textContent === 'disconnected, retrying',
                                        null, { timeout: 15000 }).then(() => true, () => false);
check(down, 'a server that goes away shows "disconnected, retrying"');
check(Number(await page.evaluate(() => document.body.dataset.snapshot)) > 0, 'the last picture stays');
check(!consoleErrors.some((e) => /page error/.test(e)), 'no script errors after the server went away');

await ctx.close();
rmSync(profile, { recursive: true, force: true });
clearTimeout(watchdog);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
