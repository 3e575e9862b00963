// The console's Webhooks page in a real browser: headless Chromium driven
// by playwright-core. Started by web/console_webhooks_e2e_test.go, which
// runs a deliverer on the console's store and a receiver on loopback, and
// checks what the receiver got.
//
// A refused form first (no event named; it keeps what was typed), then a
// webhook added through the form, sent a test event with its button, and
// its page followed until the delivery is listed as delivered with its
// answer, latency and tries; at 390 px the list and the page are looked at
// too; last the webhook is removed from the list.
//
// Environment: RELAY_URL (the console's origin, on loopback), ADMIN_TOKEN,
// CHROMIUM (the browser binary), OUT_DIR (screenshots), RECEIVER_URL (the
// webhook's URL). Exit status 0 when every step passed; each step is
// logged.

import path from "node:path";
import { check, must as mustOf, openBrowser, step, widths } from "./browser.mjs";

const must = (name) => mustOf("webhooks.mjs", name);

const base = must("RELAY_URL");
const token = must("ADMIN_TOKEN");
const executablePath = must("CHROMIUM");
const outDir = must("OUT_DIR");
const receiver = must("RECEIVER_URL");

const { page, offsite, consoleErrors, close } = await openBrowser({ executablePath, outDir });
page.on("dialog", (d) => d.accept()); // data-confirm prompts
let failed = false;

async function shoot(name, w) {
  await page.screenshot({ path: path.join(outDir, `${name}-${w.name}.png`), fullPage: true });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  check(overflow <= 1, `${name} at ${w.name} px is ${overflow}px wider than the screen`);
}

async function submit(selector) {
  const [resp] = await Promise.all([page.waitForNavigation(), page.click(selector)]);
  return resp;
}

async function flash() {
  return (await page.textContent(".flash")) ?? "";
}

try {
  const [wide, narrow] = widths;
  step("log in");
  await page.goto(`${base}/admin/webhooks`);
  await page.fill("#token", token);
  await Promise.all([page.waitForURL(/\/admin\/webhooks$/), page.click("form.login button")]);
  check((await page.textContent("main")).includes("No webhooks"), "none yet");
  await shoot("webhooks-empty", wide);

  step("a form naming no event is refused, and keeps what was typed");
  await page.fill("#add-webhook input[name=url]", receiver);
  await page.fill("#add-webhook input[name=secret]", "browser-secret");
  let resp = await submit("#add-webhook button[type=submit]");
  check(resp.status() === 400, `refused with 400, got ${resp.status()}`);
  check((await flash()).includes("events: name at least one"), `the flash says why: ${await flash()}`);
  check((await page.inputValue("#add-webhook input[name=url]")) === receiver, "the URL is kept");
  check((await page.inputValue("#add-webhook input[name=secret]")) === "", "the secret is not sent back");

  step("add a webhook");
  await page.check('#add-webhook input[value="account.needs_login"]');
  await page.check('#add-webhook input[value="pool.exhausted"]');
  await page.fill("#add-webhook input[name=secret]", "browser-secret");
  await page.selectOption("#add-webhook select[name=format]", "json");
  resp = await submit("#add-webhook button[type=submit]");
  check(resp.status() === 200, `added: ${resp.status()}`);
  check((await flash()).includes("Added the webhook"), `the flash says so: ${await flash()}`);
  check((await page.textContent("#webhooks")).includes(receiver), "the list shows it");
  check(!(await page.content()).includes("browser-secret"), "the page never shows the secret");
  await shoot("webhooks", wide);

  step("send a test event and follow its delivery");
  await submit("#webhooks form[action$='/test'] button");
  check((await flash()).includes("Sent a test event"), `the flash says so: ${await flash()}`);
  const deadline = Date.now() + 20000;
  let row = "";
  for (;;) {
    row = (await page.textContent("#deliveries tbody tr")) ?? "";
    if (row.includes("delivered")) break;
    check(Date.now() < deadline, `the delivery was not delivered within 20s: ${row}`);
    await page.reload(); // the page is rendered afresh: the console's news of a delivery
  }
  check(row.includes("webhook.test") && row.includes("204") && row.includes(" ms"), `the row has the event, answer and latency: ${row}`);
  await shoot("webhook", wide);

  step("at 390 px");
  await page.setViewportSize({ width: narrow.width, height: narrow.height });
  await shoot("webhook", narrow);
  await page.goto(`${base}/admin/webhooks`);
  check((await page.textContent("#webhooks")).includes("delivered"), "the list shows the last delivery");
  await shoot("webhooks", narrow);

  step("remove it");
  await page.setViewportSize({ width: wide.width, height: wide.height });
  await submit("#webhooks form[action$='/remove'] button");
  check((await flash()).includes("Removed the webhook"), `the flash says so: ${await flash()}`);
  check((await page.textContent("main")).includes("No webhooks"), "none left");

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
