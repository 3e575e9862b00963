// A newcomer's first run of the console, in a real browser: headless
// Chromium driven by playwright-core. Started by
// web/console_firstrun_e2e_test.go on a fresh store, which serves the one
// request this script asks for with the real Codex CLI.
//
// Environment: RELAY_URL (the relay's origin, on loopback), ADMIN_TOKEN,
// CHROMIUM (the browser binary), OUT_DIR (screenshots), ACCOUNT (the JSON
// body of POST /api/v1/accounts adding the simulated upstream's account).
//
// Talks to its test over stdin and stdout: once a key is created and its
// config block copied, it prints `need-request {"secret":..,"config":..}`
// (both read back from the clipboard) and waits for a line
// `{"thread":".."}` saying Codex was served. Its last line is a JSON
// result. Exit status 0 when every step passed; each step is logged.

import readline from "node:readline";
import path from "node:path";
import { check, must as mustOf, openBrowser, step, widths } from "./browser.mjs";

const must = (name) => mustOf("firstrun.mjs", name);

const base = must("RELAY_URL");
const token = must("ADMIN_TOKEN");
const executablePath = must("CHROMIUM");
const outDir = must("OUT_DIR");
const account = JSON.parse(must("ACCOUNT"));
const keyName = "Ana's laptop";


// The test's answers, a line each.
const answers = readline.createInterface({ input: process.stdin })[Symbol.asyncIterator]();
async function ask(what, payload) {
  console.log(`need-${what} ${JSON.stringify(payload)}`);
  const { value, done } = await answers.next();
  check(!done, `the test did not answer need-${what}`);
  return JSON.parse(value);
}

const { context, page, offsite, consoleErrors, watch, close } = await openBrowser({
  executablePath,
  outDir,
  origin: base,
  permissions: ["clipboard-read", "clipboard-write"],
});
let failed = false;

// shoot captures the page at each width, its folded forms open so they are
// seen too; at 390 px nothing may be wider than the screen.
async function shoot(name, p = page) {
  await p.evaluate(() => document.querySelectorAll("details").forEach((d) => (d.open = true)));
  for (const w of widths) {
    await p.setViewportSize({ width: w.width, height: w.height });
    await p.screenshot({ path: path.join(outDir, `${name}-${w.name}.png`), fullPage: true });
    if (w.width === 390) {
      const width = await p.evaluate(() => document.documentElement.scrollWidth);
      check(width <= 390, `${name} at 390 px is ${width}px wide`);
    }
  }
  await p.setViewportSize(widths[0]);
}

// stepsDone is the checklist's steps, each true when done.
async function stepsDone() {
  return page.$$eval("#live-setup .setup-step", (ls) => Object.fromEntries(ls.map((l) => [l.id, l.dataset.done === "true"])));
}

// search types q into the header's box and submits it.
async function search(q) {
  await page.fill("form.search input[name=q]", q);
  await Promise.all([page.waitForNavigation(), page.press("form.search input[name=q]", "Enter")]);
}

const result = { ok: false };
try {
  step("the bare address redirects to the console, which asks for the token");
  let resp = await page.goto(`${base}/`);
  let first = resp.request();
  while (first.redirectedFrom()) first = first.redirectedFrom();
  check(first.url() === `${base}/`, `the first request was for /: ${first.url()}`);
  check((await first.response()).status() === 302, `/ answered ${(await first.response()).status()}`);
  check(new URL(page.url()).pathname === "/admin/login", `/ ends on the login page: ${page.url()}`);
  await page.fill("#token", token);
  await Promise.all([page.waitForURL((u) => u.pathname === "/admin/"), page.click("form.login button")]);
  resp = await page.goto(`${base}/`);
  check(new URL(page.url()).pathname === "/admin/", `logged in, / is the overview: ${page.url()}`);

  step("a fresh install shows the checklist, every step to do");
  await page.waitForSelector("#live-setup .setup");
  check((await page.textContent("#live-setup")).includes("0 of 3 done"), "nothing done yet");
  let done = await stepsDone();
  check(!done["setup-account"] && !done["setup-key"] && !done["setup-config"], `three steps to do: ${JSON.stringify(done)}`);
  for (const [id, href] of [["account", "/admin/accounts"], ["key", "/admin/keys"], ["config", "#codex-config"]]) {
    check((await page.locator(`#setup-${id} a[href="${href}"]`).count()) === 1, `step ${id} links ${href}`);
  }
  check(!(await page.textContent("main")).includes("No accounts yet."), "no dead end: the overview says where to add an account");
  check((await page.locator("#no-accounts a[href='/admin/accounts']").count()) === 1, "the empty account list links the Accounts page");
  for (const id of ["requests", "failed"]) {
    const axes = await page.$$eval(`#chart-${id} .chart-svg.wide svg text`, (ts) => ts.map((t) => t.textContent));
    check(axes.some((t) => t.endsWith("/ min")), `${id} chart names its unit: ${axes}`);
    check(axes.some((t) => /^\d\d:\d\d$/.test(t)), `${id} chart has times: ${axes}`);
    check(axes.includes("0") && axes.includes("4"), `${id} chart has values: ${axes}`);
  }
  await shoot("firstrun-overview");

  step("an account added through the API ticks the first step, live");
  const added = await fetch(`${base}/api/v1/accounts`, {
    method: "POST",
    headers: { Authorization: `Bearer ${token}`, "Content-Type": "application/json" },
    body: JSON.stringify(account),
  });
  const addedBody = await added.text();
  check(added.status === 201, `POST /api/v1/accounts answered ${added.status}: ${addedBody}`);
  const accountID = JSON.parse(addedBody).id;
  await page.waitForSelector("#setup-account[data-done='true']");
  check((await page.textContent("#live-setup")).includes("1 of 3 done"), "one of three");

  step("the key form warns, before the first key, that it ends keyless mode");
  await page.click("#setup-key a");
  await page.waitForURL((u) => u.pathname === "/admin/keys");
  const warning = await page.textContent("form[action='/admin/keys'] #first-key-warning");
  check(warning.includes("ends keyless mode for good") && warning.includes("every client needs a key"), `the warning: ${warning}`);
  await shoot("firstrun-keys");

  step("create a key; Copy puts the secret, then the config block, on the clipboard");
  await page.fill("form[action='/admin/keys'] input[name=name]", keyName);
  await Promise.all([page.waitForNavigation(), page.click("form[action='/admin/keys'] button[type=submit]")]);
  const secret = await page.inputValue("#new-key");
  check(secret.startsWith("crk_"), `the secret is shown: ${secret.slice(0, 4)}`);
  check((await page.locator("#first-key-warning").count()) === 0, "no warning once a key exists");
  await page.click("button[data-copy='new-key']");
  await page.waitForSelector("button[data-copy='new-key'][data-copied='copied']");
  const copiedSecret = await page.evaluate(() => navigator.clipboard.readText());
  check(copiedSecret === secret, "the clipboard holds the secret");
  const shownConfig = await page.textContent("#new-key-config");
  await page.click("button[data-copy='new-key-config']");
  await page.waitForSelector("button[data-copy='new-key-config'][data-copied='copied']");
  const copiedConfig = await page.evaluate(() => navigator.clipboard.readText());
  check(copiedConfig === shownConfig, "the clipboard holds the config block as shown");
  check(copiedConfig.includes(`base_url = "${base}/backend-api/codex"`), `the block points at this relay: ${copiedConfig}`);
  await shoot("firstrun-key-created");

  step("back on the overview, two steps are done");
  await page.goto(`${base}/admin/`);
  done = await stepsDone();
  check(done["setup-account"] && done["setup-key"] && !done["setup-config"], `two done: ${JSON.stringify(done)}`);
  check((await page.textContent("#codex-config")) === copiedConfig, "the checklist shows the same config block");

  step("where the page may not write the clipboard, Copy selects the block instead");
  const plain = await context.newPage();
  watch(plain);
  await plain.addInitScript(() => Object.defineProperty(Navigator.prototype, "clipboard", { get: () => undefined }));
  await plain.goto(`${base}/admin/`);
  await plain.waitForSelector("#live-setup[data-updated]"); // its first live update has replaced it
  await plain.click("#setup-config button[data-copy='codex-config']");
  await plain.waitForSelector("#setup-config button[data-copy='codex-config'][data-copied]");
  const selected = await plain.evaluate(() => window.getSelection().toString());
  check(selected.trimEnd() === copiedConfig.trimEnd(), `the block is selected for Ctrl+C: ${JSON.stringify(selected)}`);
  await plain.close();

  step("Codex, configured with the copied block and key, is served: the checklist goes away");
  const served = await ask("request", { secret: copiedSecret, config: copiedConfig });
  await page.waitForSelector("#live-setup .setup", { state: "detached" });
  check((await page.locator("#live-setup .setup-step").count()) === 0, "no checklist once Codex was served");
  await page.goto(`${base}/admin/`);
  check((await page.locator("#live-setup").count()) === 0, "a fresh overview has no checklist either");
  await shoot("firstrun-overview-done");

  step("the request log links the request's page, which shows it whole");
  await page.goto(`${base}/admin/requests`);
  const link = page.locator("a.request-link").first();
  const requestID = (await link.getAttribute("href")).split("/").pop();
  await Promise.all([page.waitForURL(new RegExp(`/admin/requests/${requestID}$`)), link.click()]);
  const facts = await page.textContent("dl.request-facts");
  check(facts.includes("answered in full"), `the client's answer: ${facts}`);
  check(facts.includes(served.thread), "the thread id is shown");
  check((await page.locator(`a.key-link`).textContent()) === keyName, "the key is named and linked");
  check((await page.locator(`a.account-link`).getAttribute("href")) === `/admin/accounts/${accountID}`, "the account is linked to its page");
  check((await page.locator("a.thread-link").getAttribute("href")) === `/admin/bindings?thread=${encodeURIComponent(served.thread)}`, "the thread is linked");
  check((await page.locator("#attempts tbody tr").count()) >= 1, "its attempts are listed");
  check((await page.textContent("#attempts")).includes("done"), "the last attempt is done");
  await shoot("firstrun-request");
  const missing = await page.goto(`${base}/admin/requests/req_not_a_request`);
  check(missing.status() === 404, `an unknown request answered ${missing.status()}`);
  check((await page.textContent("main")).includes("No request req_not_a_request"), "the 404 page says what is missing");
  await shoot("firstrun-request-404");
  await page.goto(`${base}/admin/diagnostics`);
  check((await page.locator(`a.request-link[href="/admin/requests/${requestID}"]`).count()) === 1, "diagnostics link the request's page");

  step("the search box finds a thread, a key by name, an account by label, a request");
  // Codex gives its root thread the session's id: the search shows the
  // session's bindings, the thread's among them.
  await search(served.thread);
  check(new URL(page.url()).pathname === "/admin/bindings", `the thread's bindings: ${page.url()}`);
  check((await page.locator(`tr[data-thread="${served.thread}"]`).count()) === 1, "the thread's binding is shown");
  await search(keyName.toUpperCase());
  check(new URL(page.url()).pathname.startsWith("/admin/keys/key_"), `the key's page: ${page.url()}`);
  await search(account.label);
  check(page.url() === `${base}/admin/accounts/${accountID}`, `the account's page: ${page.url()}`);
  await search(requestID);
  check(new URL(page.url()).pathname === `/admin/requests/${requestID}`, `the request's page: ${page.url()}`);
  await search(requestID.slice(0, 20));
  check(new URL(page.url()).pathname === `/admin/requests/${requestID}`, `a unique prefix finds it too: ${page.url()}`);
  await search("no-such-id-anywhere");
  check((await page.textContent("#nothing-found")).includes("Nothing matched"), "nothing matched, and the page says so");
  check((await page.inputValue("form.search input[name=q]")) === "no-such-id-anywhere", "the box keeps the query");
  await shoot("firstrun-search-none");

  step("every page explains itself and defines its words");
  for (const [name, p, lead, words] of [
    ["overview-explained", "/admin/", "The pool at a glance", ["Switch", "Failed attempt", "Thread"]],
    ["accounts", "/admin/accounts", "The upstream credentials", ["Organisation"]],
    ["bindings", "/admin/bindings", "Which account each thread is placed on, and why", ["binding", "Thread", "Session", "Soft", "Hard"]],
    ["lanes", "/admin/lanes", "The live upstream WebSockets", ["direct", "bridge", "bridge_fork"]],
    ["diagnostics", "/admin/diagnostics", "What happened to each request", ["Attempt"]],
    ["requests", "/admin/requests", "The request log", ["Thread", "Session"]],
    ["usage", "/admin/usage", "What the request log used", []],
    ["keys", "/admin/keys", "The client keys Codex sends", []],
    ["settings", "/admin/settings", "How this relay runs", []],
    ["audit", "/admin/audit", "Every admin action", []],
  ]) {
    const r = await page.goto(base + p);
    check(r.status() === 200, `${p} answered ${r.status()}`);
    check((await page.textContent("main > p.lead")).includes(lead), `${p} explains itself`);
    const dfns = await page.$$eval("main dfn", (ds) => ds.map((d) => d.textContent));
    for (const w of words) check(dfns.includes(w), `${p} defines ${w}: ${dfns}`);
    await shoot(`firstrun-${name}`);
  }
  await page.goto(`${base}/admin/bindings`);
  const resetHint = await page.textContent("#reset-explained");
  check(resetHint.includes("next request is placed afresh") && resetHint.includes("previous_response_not_found"), `Reset explained: ${resetHint}`);
  check((await page.textContent("#pin-explained")).includes("hard evidence"), "Pin explained");

  check(consoleErrors.length === 0, `the pages logged errors: ${consoleErrors.join(" | ")}`);
  check(offsite.length === 0, `requests left loopback: ${offsite.join(", ")}`);
  Object.assign(result, { ok: true, key_name: keyName, account_id: accountID, request_id: requestID });
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
console.log(JSON.stringify(result));
process.exit(failed ? 1 : 0);
