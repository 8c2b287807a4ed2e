// Number and time formats of the pages: the same as jobs/dashboard/formatting.py renders.
"use strict";
const fmt = {
  usd(v) {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    if (v === 0) return "$0";
    return Math.abs(v) >= 1 ? "$" + v.toLocaleString("en-US", {minimumFractionDigits: 2, maximumFractionDigits: 2})
                            : ("$" + v.toFixed(6)).replace(/0+$/, "");
  },
  num(v, digits = 0) {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    return v.toLocaleString("en-US", {minimumFractionDigits: digits, maximumFractionDigits: digits});
  },
  pct(v, digits = 1) {
    return v === null || v === undefined || !isFinite(v) ? "–" : (100 * v).toFixed(digits) + "%";
  },
  duration(s) {
    if (s === null || s === undefined || !isFinite(s)) return "–";
    s = Math.round(s);
    const two = (n) => String(n).padStart(2, "0");
    if (s >= 3600) return Math.floor(s / 3600) + "h " + two(Math.floor((s % 3600) / 60)) + "m";
    if (s >= 60) return Math.floor(s / 60) + "m " + two(s % 60) + "s";
    return s + "s";
  },
  utc(t) {
    if (t === null || t === undefined) return "–";
    return new Date(t * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  },
  shortModel(m) {
    const parts = m.replace(/\/+$/, "").split("/");
    return parts[parts.length - 1] || m;
  },
};

// Fetch JSON from this server; a 401 (the session ended) sends the browser to sign in.
async function getJSON(url) {
  const response = await fetch(url, {credentials: "same-origin", cache: "no-store"});
  if (response.status === 401) {
    window.location.assign("/signin?next=" + encodeURIComponent(window.location.pathname + window.location.search));
    throw new Error("signed out");
  }
  if (!response.ok) throw new Error(url + ": " + response.status);
  return response.json();
}

// Call `step` every `ms` milliseconds, one call at a time, until it returns false.
function poll(ms, step) {
  const run = async () => {
    let again = true;
    try { again = (await step()) !== false; } catch (err) { console.warn(err); }
    if (again) setTimeout(run, ms);
  };
  setTimeout(run, ms);
}

function el(tag, attrs = {}, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}
