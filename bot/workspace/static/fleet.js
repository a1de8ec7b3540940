// The right-hand panel: the demo clock with its fast-forward buttons, and the fleet: pools,
// nodes and GPUs with utilisation, memory, who holds what, idle, unreserved, unhealthy, unknown.

import { h } from "./blocks.js";

const LABELS = {
  busy: "leased, computing", idle: "leased, idle", free: "free", unreserved: "in use without a lease",
  unhealthy: "unhealthy", silent: "not reporting", unknown: "unknown (no fresh telemetry)",
  drained: "drained",
};

function gib(mib) {
  return mib === null || mib === undefined ? "?" : (mib / 1024).toFixed(mib < 10240 ? 1 : 0);
}

function memory(used, total) {
  if (!total) return used === null || used === undefined ? "memory unknown" : `${gib(used)} GiB memory in use`;
  return `memory ${gib(used)} of ${gib(total)} GiB`;
}

// An active lease past its end waits out its grace period before the reclaim.
function ends(lease, now) {
  const left = lease.expires_at - now;
  if (left >= 60) return `ends in ${duration(left)}`;
  if (left > 0) return "ends in under a minute";
  return -left < 60 ? "expired just now" : `expired ${duration(-left)} ago`;
}

function duration(seconds) {
  const minutes = Math.round(seconds / 60);
  if (minutes < 60) return `${minutes}m`;
  const hours = Math.floor(minutes / 60);
  return minutes % 60 ? `${hours}h ${minutes % 60}m` : `${hours}h`;
}

export function renderClock(clock, forward) {
  const now = new Date(clock.now * 1000);
  const shown = new Intl.DateTimeFormat(undefined, {
    weekday: "short", day: "numeric", month: "short", hour: "numeric", minute: "2-digit",
  }).format(now);
  const busy = Boolean(clock.forwarding);
  const ahead = clock.offset_s >= 60 ? `${duration(clock.offset_s)} ahead of real time` : "real time";
  return h("div", { class: "clock" },
    h("div", { class: "clock-label" }, "Demo clock"),
    h("div", { class: "clock-now", "data-testid": "demo-now" }, shown),
    h("div", { class: "clock-ahead", "aria-live": "polite" }, busy
      ? `fast-forwarding… ${Math.floor((clock.forwarding[0] * clock.step_s) / 60)} of ${Math.ceil((clock.forwarding[1] * clock.step_s) / 60)} minutes`
      : ahead),
    busy ? h("div", { class: "progress", role: "progressbar", "aria-valuemin": 0, "aria-valuemax": clock.forwarding[1], "aria-valuenow": clock.forwarding[0] },
      h("div", { class: "progress-fill", style: `width: ${Math.round((100 * clock.forwarding[0]) / clock.forwarding[1])}%` })) : null,
    h("div", { class: "clock-buttons" },
      h("button", { type: "button", class: "btn", disabled: busy, onclick: () => forward(10) }, "⏩ 10 minutes"),
      h("button", { type: "button", class: "btn", disabled: busy, onclick: () => forward(60) }, "⏩ 1 hour")),
    h("div", { class: "clock-note" },
      "Time moves only for the demo: every 30 s a poll, every minute a sweep and its messages."));
}

function gpuCell(gpu, names, now) {
  const lease = gpu.lease;
  const util = gpu.util_pct === null || gpu.util_pct === undefined ? null : Math.round(gpu.util_pct);
  const holder = lease ? `${lease.code} ${names[lease.holder] || lease.holder}` : "";
  const lines = [
    `GPU ${gpu.index}: ${LABELS[gpu.status] || gpu.status}`,
    util === null ? "utilisation unknown" : `utilisation ${util}%`,
    memory(gpu.memory_used_mib, gpu.memory_total_mib),
  ];
  if (lease) lines.push(`${holder} (${lease.team}), ${ends(lease, now)}`);
  if (gpu.users.length) lines.push(`processes of ${gpu.users.join(", ")}`);
  if (gpu.status === "idle" && gpu.idle_min) lines.push(`idle for ${duration(gpu.idle_min * 60)}`);
  return h("div", { class: `gpu ${gpu.status}`, title: lines.join("\n"), "data-status": gpu.status },
    h("div", { class: "gpu-top" },
      h("span", { class: "gpu-index" }, gpu.index),
      h("span", { class: "gpu-util" }, util === null ? "?" : `${util}%`)),
    h("div", { class: "bar" }, h("div", { class: "bar-fill", style: `width:${util || 0}%` })),
    h("div", { class: "gpu-who" }, lease ? holder : gpu.users.length ? `⚠ ${gpu.users.join(",")}` : "—"));
}

function node(entry, names, now) {
  return h("div", { class: "node" },
    h("div", { class: "node-name" }, entry.name, entry.drained ? h("span", { class: "tag" }, "drained") : null),
    h("div", { class: "gpus" }, entry.gpus.map((gpu) => gpuCell(gpu, names, now))));
}

export function renderFleet(fleet, names, now) {
  const pools = fleet.pools.map((pool) => h("section", { class: "pool" },
    h("div", { class: "pool-head" },
      h("span", { class: "pool-name" }, pool.name, pool.protected ? h("span", { class: "tag" }, "protected") : null),
      h("span", { class: "pool-counts" }, `${pool.free} free · ${pool.leased} leased · ${pool.out} out`)),
    h("div", { class: "pool-model" }, pool.model),
    pool.nodes.map((entry) => node(entry, names, now))));
  const outside = fleet.outside.length
    ? h("section", { class: "pool" }, h("div", { class: "pool-head" }, "GPUs in no pool"),
      fleet.outside.map((entry) => node(entry, names, now)))
    : null;
  const legend = h("div", { class: "legend" }, Object.entries(LABELS).map(([status, label]) =>
    h("span", { class: `key ${status}` }, label)));
  return h("div", { class: "fleet" },
    h("div", { class: "fleet-title" }, "Fleet", fleet.paused ? h("span", { class: "tag" }, "automation paused") : null),
    pools, outside, legend);
}
