// The console as a viewer and the People page, in a real browser: headless
// Chromium driven by playwright-core. Started by
// web/console_people_e2e_test.go, which seeds the store and checks it
// afterwards.
//
// A viewer signs in with their personal token: every page they read shows
// no action a viewer cannot take (no sign-in, pause, key, reset, pin,
// price or CSV controls, no People tab); they make a token of their own
// on their tokens page, shown once; and a pause forced with the
// page's own CSRF token is refused with the 403 naming the operator role.
// An operator sees the pause and key controls but no admin's, and a price
// change forced with the page's CSRF token is refused. Then an admin signs
// in with the admin token and adds a person on the People page.
//
// Environment: RELAY_URL (the console's origin, on loopback), ADMIN_TOKEN,
// VIEWER_TOKEN (of a token named "browser"), OPERATOR_TOKEN, ACCOUNT_ID (an account to force a pause of), CHROMIUM,
// OUT_DIR (screenshots). Exit status 0 when every step passed; each step is
// logged.

import path from "node:path";
import { check, must as mustOf, openBrowser, step, widths } from "./browser.mjs";

const must = (name) => mustOf("people.mjs", name);

const base = must("RELAY_URL");
const adminToken = must("ADMIN_TOKEN");
const viewerToken = must("VIEWER_TOKEN");
const operatorToken = must("OPERATOR_TOKEN");
const accountID = must("ACCOUNT_ID");
const executablePath = must("CHROMIUM");
const outDir = must("OUT_DIR");

const { page, context, offsite, consoleErrors, close } = await openBrowser({ executablePath, outDir });
let failed = false;

async function shoot(name, w) {
  await page.screenshot({ path: path.join(outDir, `${name}-${w.name}.png`), fullPage: true });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  check(overflow <= 1, `${name} at ${w.name} px is ${overflow}px wider than the screen`);
}

async function login(token, next) {
  await page.goto(`${base}/admin/login?next=${encodeURIComponent(next)}`);
  await page.fill("#token", token);
  await Promise.all([page.waitForURL((u) => new URL(u).pathname === next), page.click("form.login button")]);
}

// absent checks that no element matches selector on the page.
async function absent(selector, what) {
  check((await page.locator(selector).count()) === 0, `${what} is absent (${selector}) on ${page.url()}`);
}

try {
  step("a viewer signs in with their personal token");
  await login(viewerToken, "/admin/accounts");
  check((await page.textContent("header .who")).startsWith("viewer · viewer@example.com"), "the header names the viewer and their role");
  await absent(`nav a[href="/admin/people"]`, "the People tab");

  for (const w of widths) {
    await page.setViewportSize({ width: w.width, height: w.height });
    step(`${w.name} px: the viewer's pages show no action above their role`);
    await page.goto(`${base}/admin/accounts`);
    check(await page.isVisible(`a[href="/admin/accounts/${accountID}"]`), "the account is listed");
    await absent("form.signin-start", "Sign in with ChatGPT");
    await absent(`form[action$="/pause"]`, "Pause");
    await absent(`form[action$="/probe"]`, "Probe");
    await absent(`form[action="/admin/accounts"]`, "the add-account forms");
    await shoot("viewer-accounts", w);
    await page.goto(`${base}/admin/accounts/${accountID}`);
    await absent("form.account-edit", "the account's settings form");
    await absent(`form[action$="/remove"]`, "Remove");
    await page.goto(`${base}/admin/keys`);
    check((await page.locator("table tbody tr").count()) >= 1, "the keys are listed");
    await absent(`form[action="/admin/keys"]`, "Create a client key");
    await absent(`form[action$="/revoke"]`, "Revoke");
    await shoot("viewer-keys", w);
    await page.goto(`${base}/admin/bindings`);
    await absent(`form[action="/admin/bindings/reset"]`, "Reset");
    await absent(`form[action="/admin/bindings/pin"]`, "Pin");
    await page.goto(`${base}/admin/settings`);
    await absent(`form[action="/admin/settings/prices"]`, "the price form");
    await page.goto(`${base}/admin/usage`);
    await absent("a.download-csv", "Download CSV");
  }

  step("the viewer makes a personal token of their own, shown once");
  await page.setViewportSize(widths[0]);
  await page.goto(`${base}/admin/tokens`);
  check(await page.isVisible(`tr[data-token="browser"]`), "their token is listed");
  await page.click("section.forms summary");
  await page.fill(`form[action="/admin/tokens"] input[name=name]`, "from chromium");
  await Promise.all([page.waitForNavigation(), page.click(`form[action="/admin/tokens"] button[type=submit]`)]);
  check((await page.inputValue("#new-token")).startsWith("crp_"), "the new token is shown");
  for (const w of widths) {
    await page.setViewportSize({ width: w.width, height: w.height });
    await shoot("viewer-tokens", w);
  }

  step("the People page is refused to a viewer");
  const people = await page.goto(`${base}/admin/people`);
  check(people.status() === 403, `GET /admin/people as a viewer answered ${people.status()}`);
  check((await page.textContent("main")).includes("needs the admin role"), "the refusal names the admin role");

  step("a pause forced with the page's own CSRF token is refused");
  await page.goto(`${base}/admin/accounts`);
  const forced = await page.evaluate(async (id) => {
    const csrf = document.querySelector("form.logout input[name=_csrf]").value;
    const r = await fetch(`/admin/accounts/${id}/pause`, { method: "POST", body: new URLSearchParams({ _csrf: csrf }) });
    return { status: r.status, text: await r.text() };
  }, accountID);
  check(forced.status === 403, `the forced pause answered ${forced.status}`);
  check(forced.text.includes("needs the operator role"), "the refusal names the operator role");

  step("an operator sees the operator's actions, and no admin's");
  await context.clearCookies();
  await login(operatorToken, "/admin/accounts");
  await page.setViewportSize(widths[0]);
  check((await page.textContent("header .who")).startsWith("operator · operator@example.com"), "the header names the operator");
  check((await page.locator(`form[action="/admin/accounts/${accountID}/pause"]`).count()) === 1, "Pause is shown");
  await absent("form.signin-start", "Sign in with ChatGPT");
  await absent(`nav a[href="/admin/people"]`, "the People tab");
  await page.goto(`${base}/admin/keys`);
  check((await page.locator(`form[action="/admin/keys"]`).count()) === 1, "Create a client key is shown");
  await page.goto(`${base}/admin/usage`);
  await page.goto(`${base}/admin/settings`);
  await absent(`form[action="/admin/settings/prices"]`, "the price form");
  const forcedPrices = await page.evaluate(async () => {
    const csrf = document.querySelector("form.logout input[name=_csrf]").value;
    const r = await fetch("/admin/settings/prices", { method: "POST", body: new URLSearchParams({ _csrf: csrf, entries: "m,default,1,1,1" }) });
    return { status: r.status, text: await r.text() };
  });
  check(forcedPrices.status === 403, `the forced price change answered ${forcedPrices.status}`);
  check(forcedPrices.text.includes("needs the admin role"), "the refusal names the admin role");

  step("an admin adds a person on the People page");
  await context.clearCookies();
  await login(adminToken, "/admin/people");
  check(await page.isVisible(`nav a[href="/admin/people"]`), "the People tab is an admin's");
  await page.setViewportSize(widths[0]);
  check((await page.locator(`tr[data-user="viewer@example.com"]`).count()) === 1, "the viewer is listed");
  await page.click("section.forms summary"); // the form is folded once people exist
  await page.fill(`form[action="/admin/people"] input[name=email]`, "new.person@example.com");
  await page.fill(`form[action="/admin/people"] input[name=name]`, "New Person");
  await page.selectOption(`form[action="/admin/people"] select[name=role]`, "operator");
  await Promise.all([page.waitForNavigation(), page.click(`form[action="/admin/people"] button[type=submit]`)]);
  check((await page.textContent(".flash")).includes("Added new.person@example.com as operator"), "the flash says who was added");
  check((await page.locator(`tr[data-user="new.person@example.com"]`).count()) === 1, "the new person is listed");
  for (const w of widths) {
    await page.setViewportSize({ width: w.width, height: w.height });
    await shoot("people", w);
  }
  check(offsite.length === 0, `requests left loopback: ${offsite.join(", ")}`);
  check(consoleErrors.length === 0, `page errors: ${consoleErrors.join("; ")}`);
} catch (e) {
  failed = true;
  console.error(String(e && e.stack ? e.stack : e));
} finally {
  await close();
}
if (failed) process.exit(1);
console.log(JSON.stringify({ ok: true }));
