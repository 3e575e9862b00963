// The console's Accounts page in a real browser: headless Chromium driven
// by playwright-core. Started by web/console_accounts_e2e_test.go, which
// seeds the accounts and checks the store afterwards.
//
// Each width (1280 and 390 px) runs the whole flow on accounts of its own:
// edit an account's label, priority and tags (a refused form first), read
// them back through the admin API, remove an account through its
// confirmation page, resume a paused one from the list, and sign in with
// ChatGPT by device code against the simulated upstream, approving the code
// there as a user would and waiting for the page's live region to say the
// account was added.
//
// Environment: RELAY_URL (the console's origin, on loopback), ADMIN_TOKEN,
// CHROMIUM (the browser binary), OUT_DIR (screenshots), SIM_URL (the
// simulated upstream), ACCOUNTS (JSON: per width, the ids of the accounts
// to edit, remove and resume, and the sim account that approves the
// sign-in). Exit status 0 when every step passed; each step is logged.

import path from "node:path";
import { check, must as mustOf, openBrowser, step, widths } from "./browser.mjs";

const must = (name) => mustOf("accounts.mjs", name);

const base = must("RELAY_URL");
const token = must("ADMIN_TOKEN");
const executablePath = must("CHROMIUM");
const outDir = must("OUT_DIR");
const simURL = must("SIM_URL");
const accounts = JSON.parse(must("ACCOUNTS"));

// api calls the admin API the way a script would, to check what the
// browser saved.
async function api(method, p) {
  const r = await fetch(base + "/api/v1" + p, { method, headers: { Authorization: `Bearer ${token}` } });
  const text = await r.text();
  return { status: r.status, body: text ? JSON.parse(text) : null };
}

const { page, offsite, consoleErrors, close } = await openBrowser({ executablePath, outDir });
let failed = false;

// shoot captures the page at the width under test; at 390 px nothing may
// be wider than the screen but scroll boxes.
async function shoot(name, w) {
  await page.screenshot({ path: path.join(outDir, `${name}-${w.name}.png`), fullPage: true });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  check(overflow <= 1, `${name} at ${w.name} px is ${overflow}px wider than the screen`);
}

// submit clicks a submit button and waits for the page it leads to.
async function submit(selector) {
  const [resp] = await Promise.all([page.waitForNavigation(), page.click(selector)]);
  return resp;
}

async function flash() {
  return (await page.textContent(".flash")) ?? "";
}

try {
  step("log in");
  await page.goto(`${base}/admin/accounts`);
  await page.fill("#token", token);
  await Promise.all([page.waitForURL(/\/admin\/accounts$/), page.click("form.login button")]);

  for (const w of widths) {
    const ids = accounts[w.name];
    await page.setViewportSize({ width: w.width, height: w.height });

    step(`${w.name} px: the account's page from the list`);
    await page.goto(`${base}/admin/accounts`);
    check(await page.isVisible("form.signin-start button"), "the Sign in with ChatGPT button is shown");
    await shoot("accounts", w);
    await submit(`tr a.key-link[href="/admin/accounts/${ids.edit}"]`);
    check(new URL(page.url()).pathname === `/admin/accounts/${ids.edit}`, `on the account's page: ${page.url()}`);
    check((await page.inputValue("form.account-edit input[name=priority]")) === "1", "the form holds the account's priority");
    await shoot("account", w);

    step(`${w.name} px: a bad priority is refused, and the form keeps what was typed`);
    await page.fill("form.account-edit input[name=label]", `renamed ${w.name}`);
    await page.fill("form.account-edit input[name=priority]", "high");
    await page.fill("form.account-edit input[name=tags]", `e2e, w${w.name}`);
    const refused = await submit("form.account-edit button[type=submit]");
    check(refused.status() === 400, `a refused form answers 400, not ${refused.status()}`);
    check((await flash()).includes("Not saved: priority: must be a whole number"), `the flash says why: ${await flash()}`);
    check((await page.inputValue("form.account-edit input[name=label]")) === `renamed ${w.name}`, "the label typed is kept");
    check((await page.inputValue("form.account-edit input[name=priority]")) === "high", "the priority typed is kept");
    check((await page.inputValue("form.account-edit input[name=tags]")) === `e2e, w${w.name}`, "the tags typed are kept");
    let got = await api("GET", `/accounts/${ids.edit}`);
    check(got.body.label === `editable ${w.name}` && got.body.priority === 1, `nothing was saved: ${JSON.stringify(got.body)}`);
    await shoot("account-refused", w);

    step(`${w.name} px: label, priority and tags saved`);
    await page.fill("form.account-edit input[name=priority]", "42");
    const saved = await submit("form.account-edit button[type=submit]");
    check(saved.status() === 200 && saved.request().method() === "GET", "the save redirects to the account's page");
    check((await flash()).includes(`Saved renamed ${w.name}: label, tags, priority changed`), `the flash says what changed: ${await flash()}`);
    check((await page.textContent("h1")).includes(`renamed ${w.name}`), "the page has the new label");
    check((await page.inputValue("form.account-edit input[name=priority]")) === "42", "the form shows the saved priority");
    got = await api("GET", `/accounts/${ids.edit}`);
    check(got.status === 200, `GET /api/v1/accounts/${ids.edit} answered ${got.status}`);
    check(got.body.label === `renamed ${w.name}`, `the API has the label: ${got.body.label}`);
    check(got.body.priority === 42, `the API has the priority: ${got.body.priority}`);
    check(JSON.stringify(got.body.tags) === JSON.stringify(["e2e", `w${w.name}`]), `the API has the tags: ${JSON.stringify(got.body.tags)}`);
    await shoot("account-saved", w);

    step(`${w.name} px: remove an account through its confirmation page`);
    await page.goto(`${base}/admin/accounts/${ids.remove}`);
    await page.click("summary:has-text('Remove this account')");
    await submit("button:has-text('Remove account…')");
    check(new URL(page.url()).pathname === `/admin/accounts/${ids.remove}/remove`, `on the confirmation page: ${page.url()}`);
    const what = await page.textContent("#removal");
    check(what.includes("Its 1 thread binding and 1 session binding are deleted with it."), `the page counts its bindings: ${what}`);
    check(what.includes("goes to another account at its next request"), "the page says what happens to its threads");
    got = await api("GET", `/accounts/${ids.remove}`);
    check(got.status === 200, "nothing is removed before the confirmation");
    await shoot("remove-confirm", w);
    await submit("form.confirm-remove button[type=submit]");
    check(new URL(page.url()).pathname === "/admin/accounts", `back on the list: ${page.url()}`);
    check((await flash()).includes(`Removed doomed ${w.name} and its bindings`), `the flash says what was removed: ${await flash()}`);
    check((await page.locator(`a[href="/admin/accounts/${ids.remove}"]`).count()) === 0, "the account is gone from the list");
    got = await api("GET", `/accounts/${ids.remove}`);
    check(got.status === 404, `the API no longer has it: ${got.status}`);
    await shoot("removed", w);

    step(`${w.name} px: resume a paused account from the list`);
    const row = page.locator("tr", { has: page.locator(`button[data-resume="${ids.paused}"]`) });
    check((await row.textContent()).includes("paused"), "the row shows it paused");
    await submit(`button[data-resume="${ids.paused}"]`);
    check((await flash()).includes(`Resumed resting ${w.name}`), `the flash says it resumed: ${await flash()}`);
    check((await page.locator(`button[data-resume="${ids.paused}"]`).count()) === 0, "nothing left to resume");
    got = await api("GET", `/accounts/${ids.paused}`);
    check(got.body.status === "active", `the API has it active: ${got.body.status}`);
    await shoot("resumed", w);

    step(`${w.name} px: sign in with ChatGPT by device code`);
    await submit("form.signin-start button");
    check(/\/admin\/accounts\/signin\/signin_/.test(page.url()), `on the sign-in's page: ${page.url()}`);
    const code = (await page.textContent("code.user-code")).trim();
    check(/^[A-Z0-9]{4}-[A-Z0-9]{4}$/.test(code), `the page shows a user code: ${code}`);
    const verify = await page.getAttribute("a.verification-url", "href");
    check(verify === `${simURL}/codex/device`, `the page says where to enter it: ${verify}`);
    check((await page.getAttribute("section.signin", "data-state")) === "waiting for approval", "the sign-in waits");
    await shoot("signin-pending", w);
    // The user enters the code at ChatGPT and approves, here the sim's.
    const approved = await fetch(`${simURL}/_sim/deviceauth/approve`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ user_code: code, account: ids.signin }),
    });
    check(approved.status === 204, `the sim took the approval: ${approved.status}`);
    // The page's live region follows the sign-in: no reload.
    await page.waitForSelector('section.signin[data-state="added"]', { timeout: 30000 });
    const outcome = await page.textContent("section.signin");
    check(outcome.includes(`Signed in as ${ids.signin}@example.com`), `the page says who signed in: ${outcome}`);
    check((await page.locator("form.signin-cancel").count()) === 0, "nothing left to cancel");
    await shoot("signin-done", w);
    await submit("a.signin-account");
    check((await page.textContent("main")).includes(`${ids.signin}@example.com`), "the new account's page");
    const signedIn = new URL(page.url()).pathname.split("/").pop();
    got = await api("GET", `/accounts/${signedIn}`);
    check(got.body.kind === "chatgpt" && got.body.account_id === `cg-${ids.signin}`, `the API has the account: ${JSON.stringify(got.body)}`);
    await shoot("signed-in-account", w);
  }

  check(consoleErrors.length === 0, `the pages logged errors: ${consoleErrors.join(" | ")}`);
  check(offsite.length === 0, `requests left loopback: ${offsite.join(", ")}`);
  console.log(JSON.stringify({ ok: true }));
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
