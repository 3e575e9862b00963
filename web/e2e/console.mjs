// The admin console in a real browser: headless Chromium driven by
// playwright-core. Started by web/console_e2e_test.go, which runs a real
// Codex turn through the relay first (so THREAD_ID has a binding) and checks
// the store and the next Codex turn afterwards.
//
// Environment: RELAY_URL (the console's origin, on loopback), ADMIN_TOKEN,
// THREAD_ID, CHROMIUM (the browser binary), OUT_DIR (screenshots),
// BUDGETED_KEY (a client key with limits, whose page edits them).
// Exit status 0 when every step passed; each step is logged.

import fs from "node:fs";
import path from "node:path";
import { check, must as mustOf, openBrowser, step, widths } from "./browser.mjs";

const must = (name) => mustOf("console.mjs", name);

const base = must("RELAY_URL");
const token = must("ADMIN_TOKEN");
const thread = must("THREAD_ID");
const executablePath = must("CHROMIUM");
const outDir = must("OUT_DIR");
const budgetedKey = must("BUDGETED_KEY");

// The CSV contract of GET /api/v1/usage grouped by day and key: its header line.
const usageCSVHeader =
  "day,key_id,requests,input_tokens,cached_input_tokens,output_tokens,reasoning_tokens,total_tokens,cost_usd,unpriced_requests,cache_hit_rate,ttft_p50_ms,ttft_p95_ms,errors";

const { page, offsite, consoleErrors, close } = await openBrowser({ executablePath, outDir });
let failed = false;
page.on("dialog", (d) => d.accept()); // data-confirm prompts

// shoot captures the page at each width, its folded forms open so they are
// seen too.
async function shoot(name) {
  await page.evaluate(() => document.querySelectorAll("details").forEach((d) => (d.open = true)));
  for (const w of widths) {
    await page.setViewportSize({ width: w.width, height: w.height });
    const file = path.join(outDir, `${name}-${w.name}.png`);
    await page.screenshot({ path: file, fullPage: true });
    // At 390 px nothing may be wider than the screen but scroll boxes.
    if (w.width === 390) {
      const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
      check(overflow <= 1, `${name} at 390 px is ${overflow}px wider than the screen`);
    }
  }
  await page.setViewportSize(widths[0]);
}

// usageFigures describes each chart of the Usage page: whether it shows
// one SVG, its legend's colours (from the stylesheet), how many shapes of each
// colour the SVG draws with a size (a zero-height bar does not count), and
// how wide the SVG is drawn beside its figure.
async function usageFigures() {
  return page.$$eval("figure.usage-chart", (figs) =>
    figs.map((f) => {
      const hex = (rgb) => "#" + rgb.match(/\d+/g).slice(0, 3).map((n) => Number(n).toString(16).padStart(2, "0")).join("");
      // One drawing per width: the one shown is the one that counts.
      const shown = [...f.querySelectorAll(".chart-svg > svg")].filter((s) => s.getBoundingClientRect().width > 0);
      const svg = shown.length === 1 ? shown[0] : null;
      const swatches = [...f.querySelectorAll("figcaption .legend-key")];
      const colors = swatches.map((k) => hex(getComputedStyle(k.querySelector(".swatch")).backgroundColor));
      const drawn = colors.map((c) => {
        if (!svg) return 0;
        let n = 0;
        for (const e of svg.querySelectorAll(`[fill="${c}"], [stroke="${c}"]`)) {
          const b = e.getBBox();
          if (e.getAttribute("fill") === c ? b.width > 0 && b.height > 0 : b.width > 0 || b.height > 0) n++;
        }
        return n;
      });
      return {
        id: f.dataset.chart,
        svg: !!svg,
        labels: swatches.map((k) => k.textContent.trim()),
        colors,
        drawn,
        width: svg ? svg.getBoundingClientRect().width : 0,
        figWidth: f.getBoundingClientRect().width,
        rows: f.querySelectorAll("table tbody tr").length,
      };
    }),
  );
}

try {
  step("an anonymous visit to the Bindings page is sent to the login page");
  await page.goto(`${base}/admin/bindings?thread=${encodeURIComponent(thread)}`);
  check(new URL(page.url()).pathname === "/admin/login", `expected the login page, got ${page.url()}`);
  await shoot("login");

  step("a wrong token is refused");
  await page.fill("#token", "not-the-token");
  await Promise.all([page.waitForLoadState("load"), page.click("form.login button")]);
  check((await page.textContent("body")).includes("not the admin token"), "the login page says the token is wrong");

  step("log in with the admin token");
  await page.fill("#token", token);
  await Promise.all([page.waitForURL(/\/admin\/bindings/), page.click("form.login button")]);
  check(new URL(page.url()).searchParams.get("thread") === thread, "back on the page first asked for");

  step("the thread's binding from the real Codex turn is on the Bindings page");
  const row = page.locator(`tr[data-thread="${thread}"]`);
  check((await row.count()) === 1, `one binding row for thread ${thread}, found ${await row.count()}`);
  const bindingID = await row.getAttribute("data-binding-id");
  const rowText = await row.textContent();
  check(rowText.includes("thread") && rowText.includes("soft"), `the row shows kind and strength: ${rowText}`);
  await shoot("bindings");

  step("a form post without the CSRF token is refused");
  const refused = await page.evaluate(async (t) => {
    const form = document.createElement("form");
    form.method = "post";
    form.action = "/admin/bindings/reset";
    for (const [k, v] of [["by", "thread"], ["value", t], ["return", "/admin/bindings"]]) {
      const i = document.createElement("input");
      i.type = "hidden";
      i.name = k;
      i.value = v;
      form.appendChild(i);
    }
    document.body.appendChild(form);
    const r = await fetch(form.action, { method: "POST", body: new URLSearchParams(new FormData(form)) });
    return { status: r.status, text: await r.text() };
  }, thread);
  check(refused.status === 403, `a post without _csrf answered ${refused.status}`);
  check(refused.text.includes("CSRF"), "the refusal says why");
  const [nav] = await Promise.all([
    page.waitForNavigation(),
    page.evaluate(() => document.querySelector("body > form[action='/admin/bindings/reset']").submit()),
  ]);
  check(nav.status() === 403, `a submitted form without _csrf answered ${nav.status()}`);
  await shoot("csrf-refused");
  await page.goto(`${base}/admin/bindings?thread=${encodeURIComponent(thread)}`);
  check((await page.locator(`tr[data-binding-id="${bindingID}"]`).count()) === 1, "the refused post reset nothing");

  step("reset the binding from the Bindings page");
  await Promise.all([
    page.waitForURL(/\/admin\/bindings/),
    page.click(`tr[data-binding-id="${bindingID}"] button[data-reset="binding"]`),
  ]);
  const flash = await page.textContent(".flash");
  check(flash.includes(`Reset binding ${bindingID}`), `the page says what was reset: ${flash}`);
  check((await page.locator(`tr[data-thread="${thread}"]`).count()) === 0, "the binding is gone");
  check(await page.isVisible("#no-bindings"), "the page says no binding matches");
  await shoot("bindings-after-reset");

  step("pin a session to an account from the Bindings page");
  await page.goto(`${base}/admin/bindings`);
  await page.click("summary:has-text('Pin a session or thread')");
  await page.selectOption("form[action='/admin/bindings/pin'] select[name=kind]", "session");
  await page.fill("form[action='/admin/bindings/pin'] input[name=value]", "e2e-pinned-session");
  await Promise.all([page.waitForURL(/\/admin\/bindings/), page.click("form[action='/admin/bindings/pin'] button")]);
  check((await page.textContent(".flash")).includes("Pinned session e2e-pinned-session"), "the page says what was pinned");
  const pinned = page.locator("tr.pinned");
  check((await pinned.count()) === 1, "the pin is shown as a pin");
  check((await pinned.textContent()).includes("raw session"), "the pin names its kind");
  await shoot("bindings-all");

  step("the reset is in the audit log");
  await page.goto(`${base}/admin/audit`);
  const entry = page.locator(`tr[data-action="binding.reset"]`).first();
  const entryText = await entry.textContent();
  check(entryText.includes(`binding:${bindingID}`), `the audit entry names the binding: ${entryText}`);
  check(entryText.includes("admin") && entryText.includes("127.0.0.1"), `the audit entry names who: ${entryText}`);
  check((await page.locator(`tr[data-action="login"]`).count()) >= 1, "the login is audited");
  check((await page.locator(`tr[data-action="login.failed"]`).count()) >= 1, "the failed login is audited");
  await shoot("audit");

  step("the overview updates live over SSE");
  await page.goto(`${base}/admin/`);
  await page.waitForSelector("#live-overview[data-updated]", { timeout: 10000 });
  check((await page.textContent("#live-overview")).includes("Accounts available"), "the live region holds the overview");
  await shoot("overview");

  for (const [name, p, want] of [
    ["accounts", "/admin/accounts", "Add an API-key account"],
    ["lanes", "/admin/lanes", "Lanes"],
    ["diagnostics", "/admin/diagnostics", "usage_limit"],
    ["requests", "/admin/requests", "/backend-api/codex/responses"],
    ["keys", "/admin/keys", "Create a client key"],
    ["settings", "/admin/settings", "Schema version"],
  ]) {
    step(`the ${name} page`);
    const resp = await page.goto(base + p);
    check(resp.status() === 200, `${p} answered ${resp.status()}`);
    check((await page.textContent("main")).includes(want), `${p} shows "${want}"`);
    await shoot(name);
  }

  step("the request log of the Codex thread sums its usage");
  await page.goto(`${base}/admin/requests?thread=${encodeURIComponent(thread)}`);
  const threadUsage = await page.textContent("section.thread-usage");
  check(threadUsage.includes("Cache-hit rate") && threadUsage.includes("changed account"), `the thread's usage: ${threadUsage}`);
  check((await page.locator("table.thread-accounts tbody tr").count()) >= 1, "the accounts that served the thread are listed");
  await shoot("requests-thread");

  step("the Usage page draws every chart, at desktop and phone widths");
  await page.goto(`${base}/admin/usage`);
  check((await page.textContent("main")).includes("Budgets"), "the Usage page has its budgets");
  for (const w of widths) {
    await page.setViewportSize({ width: w.width, height: w.height });
    const figs = await usageFigures();
    check(figs.length === 4, `four charts at ${w.name} px, found ${figs.length}`);
    for (const f of figs) {
      check(f.svg, `${f.id} at ${w.name} px has an SVG`);
      check(f.colors.length > 0, `${f.id} has a legend`);
      f.colors.forEach((c, i) => check(f.drawn[i] > 0, `${f.id} at ${w.name} px draws its series ${f.labels[i]} (${c})`));
      check(f.width > 100 && f.width <= f.figWidth + 0.5, `${f.id} at ${w.name} px fits its figure: ${f.width} of ${f.figWidth}`);
      check(f.rows > 0, `${f.id} has its numbers as a table`);
    }
  }
  await page.setViewportSize(widths[0]);
  const gauges = page.locator(`#budgets meter`);
  check((await gauges.count()) === 3, `the budgeted key's three limits are gauges, found ${await gauges.count()}`);
  await shoot("usage");

  step("the Download CSV link downloads the report");
  const [download] = await Promise.all([page.waitForEvent("download"), page.click("a.download-csv")]);
  check(/^usage-.+\.csv$/.test(download.suggestedFilename()), `the file is named for its window: ${download.suggestedFilename()}`);
  const csv = fs.readFileSync(await download.path(), "utf8");
  const csvLines = csv.trim().split("\n");
  check(csvLines[0] === usageCSVHeader, `the CSV header is the contract's: ${csvLines[0]}`);
  check(csvLines.length >= 1 + 6, `a row per day and key: ${csvLines.length - 1} rows`);

  step("the Usage page by model, over one day by the hour");
  await page.click("nav.presets a:has-text('24 hours')");
  await page.selectOption("select[name=by]", "model");
  await Promise.all([page.waitForURL(/by=model/), page.click("form.usage-filters button[type=submit]")]);
  check((await page.textContent("#chart-tokens figcaption")).includes("gpt-5.1-codex-mini"), "the tokens are stacked by model");
  check((await page.textContent("#chart-tokens figcaption")).includes("per hour"), "one day is charted by the hour");
  await shoot("usage-day");

  step("a key's limits are edited on its page");
  await page.goto(`${base}/admin/keys`);
  await Promise.all([page.waitForURL(new RegExp(`/admin/keys/${budgetedKey}$`)), page.click(`a[href="/admin/keys/${budgetedKey}"]`)]);
  check((await page.locator("#limits meter").count()) === 3, "the key's three limits are gauges");
  check((await page.textContent("#limits")).includes("tokens/5h"), "the gauges are named");
  await shoot("key");
  await page.fill("textarea[name=limits]", "tokens/5h=60000\ntokens/year=1");
  const [refusedSave] = await Promise.all([page.waitForNavigation(), page.click("form.key-limits button[type=submit]")]);
  check(refusedSave.status() === 400, `a refused form answers 400, not ${refusedSave.status()}`);
  check((await page.textContent(".flash")).includes("limits: limit 2: window must be one of"), "the API's message for a bad window");
  check((await page.inputValue("textarea[name=limits]")).includes("tokens/year=1"), "the form keeps what was typed");
  await shoot("key-refused");
  await page.fill("textarea[name=limits]", "tokens/5h=60000\nconcurrent=4");
  await page.selectOption("select[name=max_reasoning_effort]", "high");
  const [save] = await Promise.all([page.waitForNavigation(), page.click("form.key-limits button[type=submit]")]);
  check(save.status() === 200 && save.request().method() === "GET", "the save redirects to a page");
  check(new URL(page.url()).pathname === `/admin/keys/${budgetedKey}`, `back on the key's page: ${page.url()}`);
  check((await page.textContent(".flash")).includes("Saved the limits and policy"), "the page says it saved");
  check((await page.locator("#limits meter").count()) === 2, "two limits now");
  check((await page.inputValue("textarea[name=limits]")).trim() === "tokens/5h=60000\nconcurrent=4", "the form shows the saved limits");
  await shoot("key-saved");

  step("log out");
  await Promise.all([page.waitForURL(/\/admin\/login/), page.click("form.logout button")]);
  await page.goto(`${base}/admin/`);
  check(new URL(page.url()).pathname === "/admin/login", "after logging out the console asks for the token again");

  check(consoleErrors.length === 0, `the pages logged errors: ${consoleErrors.join(" | ")}`);
  check(offsite.length === 0, `requests left loopback: ${offsite.join(", ")}`);
  console.log(JSON.stringify({ ok: true, reset_binding: bindingID }));
} catch (err) {
  failed = true;
  console.error(String(err && err.stack ? err.stack : err));
  try {
    await page.screenshot({ path: path.join(outDir, "failure.png"), fullPage: true });
    console.error(`at ${page.url()}; screenshot in ${path.join(outDir, "failure.png")}`);
  } catch {}
} finally {
  await close();
}
process.exit(failed ? 1 : 0);
