// Chromium (headless, through playwright-core) as a web page's S3 client: loads a page from
// each origin given and runs `fetch` calls from it against the S3 endpoint, so that the
// browser's own CORS checks (preflights included) decide what the page may do.
//
//   node browser_cors.mjs '{"chromium": PATH, "pages": [{"origin": URL, "calls": [CALL...]}]}'
//
// A CALL is {"url", "method", "headers", "body"}, or {"url", "method", "form", "file"} for
// a form upload (multipart fields, then the file); the answer printed (JSON, one list per
// page) is {"status", "etag", "text"} for a call the browser let through, or {"blocked": msg}
// where it refused the page the answer. PLAYWRIGHT_DIR names the directory whose
// node_modules hold playwright-core.
import { createRequire } from 'node:module';

const require = createRequire(process.env.PLAYWRIGHT_DIR + '/');
const { chromium } = require('playwright-core');

const spec = JSON.parse(process.argv[2]);
const browser = await chromium.launch({
  executablePath: spec.chromium,
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
const out = [];
try {
  for (const page of spec.pages) {
    const tab = await browser.newPage();
    await tab.goto(page.origin + '/');
    const answers = await tab.evaluate(async (calls) => {
      const res = [];
      for (const c of calls) {
        try {
          let body = c.body;
          if (c.form) {
            // A browser upload form: its fields, then the file.
            body = new FormData();
            for (const [k, v] of Object.entries(c.form)) body.append(k, v);
            body.append('file', new Blob([c.file], { type: 'text/plain' }), 'from-form.txt');
          }
          const r = await fetch(c.url, { method: c.method, headers: c.headers || {}, body, cache: 'no-store' });
          res.push({ status: r.status, etag: r.headers.get('etag'), text: await r.text() });
        } catch (e) {
          res.push({ blocked: String(e) });
        }
      }
      return res;
    }, page.calls);
    out.push(answers);
    await tab.close();
  }
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
