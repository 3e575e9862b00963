// What the console's browser scripts share (console.mjs, accounts.mjs,
// firstrun.mjs): the widths they look at, their checks, and a headless
// Chromium that may not leave loopback, with every request off it and
// every page error collected for the script's last check.

import { chromium } from "playwright-core";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

// The widths every page is looked at: a laptop's and a phone's.
export const widths = [
  { name: "1280", width: 1280, height: 800 },
  { name: "390", width: 390, height: 844 },
];

// must reads a required environment variable, or ends the script with 2.
export function must(script, name) {
  const v = process.env[name];
  if (!v) {
    console.error(`${script}: ${name} is not set`);
    process.exit(2);
  }
  return v;
}

export function step(msg) {
  console.log(`step: ${msg}`);
}

export function check(cond, msg) {
  if (!cond) throw new Error(`check failed: ${msg}`);
}

// openBrowser starts Chromium (nothing may leave loopback: no DNS outside
// it, no background services) with outDir made for screenshots, origin
// granted permissions (e.g. the clipboard's); hosts are the loopback names
// it may reach (127.0.0.1, and localhost for a test's other site). offsite collects requests
// that left loopback, consoleErrors script errors, CSP violations and
// assets that failed to load; watch(page) makes a page of the script's
// own report into them (the first page is watched already); close ends
// it all.
export async function openBrowser({ executablePath, outDir, origin, permissions = [], hosts = ["127.0.0.1"] }) {
  fs.mkdirSync(outDir, { recursive: true });
  const userDataDir = fs.mkdtempSync(path.join(os.tmpdir(), "codex-relay-chromium-"));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath,
    headless: true,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
      "--host-resolver-rules=MAP * ~NOTFOUND, " + hosts.map((h) => "EXCLUDE " + h).join(", "),
    ],
    viewport: widths[0],
  });
  if (permissions.length > 0) await context.grantPermissions(permissions, { origin });
  const offsite = [];
  context.on("request", (req) => {
    const u = new URL(req.url());
    if (u.protocol !== "data:" && !hosts.includes(u.hostname)) offsite.push(req.url());
  });
  const consoleErrors = [];
  // Script errors and CSP violations count; refused requests are the
  // test's own doing, but a stylesheet, script or icon that fails to load
  // counts.
  const watch = (p) => {
    p.on("console", (m) => {
      if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) consoleErrors.push(m.text());
    });
    p.on("pageerror", (e) => consoleErrors.push(String(e)));
    p.on("response", (r) => {
      const type = r.request().resourceType();
      if (["stylesheet", "script", "image", "font"].includes(type) && r.status() >= 400) {
        consoleErrors.push(`${type} ${r.url()} answered ${r.status()}`);
      }
    });
  };
  const page = context.pages()[0] ?? (await context.newPage());
  watch(page);
  // close ends the browser and removes its profile.
  const close = async () => {
    await context.close();
    fs.rmSync(userDataDir, { recursive: true, force: true });
  };
  return { context, page, offsite, consoleErrors, watch, close };
}
