// Single sign-on in a real browser: headless Chromium driven by
// playwright-core. Started by web/console_sso_e2e_test.go, which runs the
// OpenID provider (mockoidc, on localhost: another site than the relay on
// 127.0.0.1) and checks the store afterwards.
//
// The login page offers single sign-on; its link goes to the provider and
// back to the relay's callback, a cross-site redirect on which the
// sign-in's state cookie (SameSite=Lax) must come along; the landing page
// moves on to the console with the session cookie (SameSite=Strict), and
// the header names the person and the role their group maps to.
//
// Environment: RELAY_URL (the console's origin, on loopback), PROVIDER_HOST
// (the provider's host name), EMAIL, ROLE, CHROMIUM, OUT_DIR (screenshots).
// Exit status 0 when every step passed; each step is logged.

import path from "node:path";
import { check, must as mustOf, openBrowser, step } from "./browser.mjs";

const must = (name) => mustOf("sso.mjs", name);

const base = must("RELAY_URL");
const providerHost = must("PROVIDER_HOST");
const email = must("EMAIL");
const role = must("ROLE");
const executablePath = must("CHROMIUM");
const outDir = must("OUT_DIR");

const { page, offsite, consoleErrors, close } = await openBrowser({ executablePath, outDir, hosts: ["127.0.0.1", providerHost] });
let failed = false;
try {
  step("the login page offers single sign-on");
  await page.goto(`${base}/admin/login?next=${encodeURIComponent("/admin/keys")}`);
  const sso = page.locator("a.sso");
  check((await sso.count()) === 1, "a single sign-on link");
  await page.screenshot({ path: path.join(outDir, "sso-login.png"), fullPage: true });

  step("through the provider and back, to the page asked for");
  const hops = [];
  page.on("request", (r) => { if (r.isNavigationRequest()) hops.push(r.url()); });
  await Promise.all([page.waitForURL((u) => new URL(u).hostname === providerHost, { timeout: 30000 }), sso.click()]);
  await page.screenshot({ path: path.join(outDir, "sso-provider.png"), fullPage: true });
  // The provider's own page starts the way back: a cross-site navigation
  // for the relay's cookies.
  await Promise.all([page.waitForURL((u) => new URL(u).pathname === "/admin/keys", { timeout: 30000 }), page.click("#consent")]);
  check(hops.some((u) => new URL(u).hostname === providerHost), `the browser went to the provider (${hops.join(" → ")})`);
  check(hops.some((u) => new URL(u).pathname === "/admin/oidc/callback"), "and came back to the callback");
  const who = (await page.textContent("header .who")) ?? "";
  check(who.includes(email) && who.includes(role), `the header names ${email} as ${role}: "${who}"`);
  await page.screenshot({ path: path.join(outDir, "sso-signed-in.png"), fullPage: true });

  step("the session stands on the next page");
  await page.goto(`${base}/admin/`);
  check(new URL(page.url()).pathname === "/admin/", `the overview answers, not the login page (${page.url()})`);
  check(offsite.length === 0, `nothing left loopback: ${offsite.join(", ")}`);
  check(consoleErrors.length === 0, `no console errors: ${consoleErrors.join("; ")}`);
} catch (e) {
  failed = true;
  console.error(String(e));
  await page.screenshot({ path: path.join(outDir, "sso-failure.png"), fullPage: true }).catch(() => {});
} finally {
  await close();
}
process.exit(failed ? 1 : 0);
