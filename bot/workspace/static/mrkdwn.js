// Slack's mrkdwn as HTML: *bold*, _italic_, ~strike~, `code`, ```pre```, > quotes, <@U…>,
// <#C…>, <!date^…> (in the browser's time zone, through Intl), <url|label>, :emoji:.
// Everything is escaped first; only the markup made here reaches innerHTML.

const EMOJI = {
  white_check_mark: "✅", warning: "⚠️", no_entry: "⛔", hourglass: "⌛", inbox_tray: "📥",
  information_source: "ℹ️", recycle: "♻️", eyes: "👀", double_vertical_bar: "⏸️", x: "❌",
  lock: "🔒", clock3: "🕒", zzz: "💤", rocket: "🚀", tada: "🎉", bell: "🔔", fire: "🔥",
  one: "1️⃣", two: "2️⃣", three: "3️⃣", heavy_check_mark: "✔️", stopwatch: "⏱️", checkered_flag: "🏁",
  hourglass_flowing_sand: "⏳", leftwards_arrow_with_hook: "↩️", arrow_forward: "▶️",
  arrow_down: "⬇️",
};

export function escapeHtml(text) {
  return String(text)
    .replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
}

// Slack escapes only &, < and > in message text; undo that before escaping for HTML.
function unslack(text) {
  return String(text).replace(/&lt;/g, "<").replace(/&gt;/g, ">").replace(/&amp;/g, "&");
}

function localDay(date) {
  return new Intl.DateTimeFormat("en-CA", { year: "numeric", month: "2-digit", day: "2-digit" })
    .format(date);
}

function ordinal(day) {
  const tens = day % 100;
  if (tens >= 11 && tens <= 13) return `${day}th`;
  return `${day}${{ 1: "st", 2: "nd", 3: "rd" }[day % 10] || "th"}`;
}

function longDate(date, weekday) {
  const parts = new Intl.DateTimeFormat("en-US", {
    weekday: "long", month: "long", day: "numeric", year: "numeric",
  }).formatToParts(date);
  const part = (type) => (parts.find((p) => p.type === type) || {}).value;
  const text = `${part("month")} ${ordinal(Number(part("day")))}, ${part("year")}`;
  return weekday ? `${part("weekday")}, ${text}` : text;
}

function relativeDay(date, now) {
  const day = 24 * 3600 * 1000;
  const names = { [localDay(now)]: "today" };
  names[localDay(new Date(now.getTime() - day))] = "yesterday";
  names[localDay(new Date(now.getTime() + day))] = "tomorrow";
  return names[localDay(date)];
}

function ago(date, now) {
  const seconds = Math.round((now.getTime() - date.getTime()) / 1000);
  const format = new Intl.RelativeTimeFormat("en", { numeric: "auto" });
  const steps = [[60, "second"], [3600, "minute"], [86400, "hour"], [Infinity, "day"]];
  let unit = 1;
  for (const [limit, name] of steps) {
    if (Math.abs(seconds) < limit) return format.format(-Math.round(seconds / unit), name);
    unit = limit;
  }
  return "";
}

// `<!date^epoch^format^link|fallback>` rendered for the reader's zone; `now` is the demo clock.
export function formatDate(epoch, format, now) {
  const date = new Date(epoch * 1000);
  const time = (secs) => new Intl.DateTimeFormat(undefined, {
    hour: "numeric", minute: "2-digit", second: secs ? "2-digit" : undefined,
  }).format(date);
  const short = new Intl.DateTimeFormat("en-US", { month: "short", day: "numeric", year: "numeric" })
    .format(date);
  const tokens = {
    date_num: () => localDay(date),
    date: () => longDate(date, false),
    date_short: () => short,
    date_long: () => longDate(date, true),
    date_pretty: () => relativeDay(date, now) || longDate(date, false),
    date_short_pretty: () => relativeDay(date, now) || short,
    date_long_pretty: () => relativeDay(date, now) || longDate(date, true),
    time: () => time(false),
    time_secs: () => time(true),
    ago: () => ago(date, now),
  };
  return format.replace(/\{(\w+)\}/g, (whole, name) => (tokens[name] ? tokens[name]() : whole));
}

function token(inner, ctx) {
  const [target, label] = splitOnce(inner, "|");
  if (target.startsWith("@")) {
    const id = target.slice(1);
    return `<span class="mention">@${escapeHtml(label || ctx.names[id] || id)}</span>`;
  }
  if (target.startsWith("#")) {
    const id = target.slice(1);
    const channel = ctx.channels[id];
    return `<span class="mention">#${escapeHtml(label || channel || id)}</span>`;
  }
  if (target.startsWith("!date^")) {
    const [, epoch, format, link] = target.split("^");
    const shown = formatDate(Number(epoch), format || "{date_num} {time}", ctx.now);
    const title = escapeHtml(label || "");
    const iso = new Date(Number(epoch) * 1000).toISOString();
    const body = `<time class="date" datetime="${iso}" title="${title}">${escapeHtml(shown)}</time>`;
    return link ? `<a href="${escapeHtml(link)}" target="_blank" rel="noopener">${body}</a>` : body;
  }
  if (target.startsWith("!")) {
    return `<span class="mention">@${escapeHtml(label || target.slice(1).split("^")[0])}</span>`;
  }
  if (/^(https?:|mailto:)/.test(target)) {
    return `<a href="${escapeHtml(target)}" target="_blank" rel="noopener">${escapeHtml(label || target)}</a>`;
  }
  return escapeHtml(`<${inner}>`);
}

function splitOnce(text, separator) {
  const at = text.indexOf(separator);
  return at < 0 ? [text, ""] : [text.slice(0, at), unslack(text.slice(at + 1))];
}

function inline(text, ctx) {
  const held = [];
  const hold = (html) => `\u0000${held.push(html) - 1}\u0000`;
  let out = text.replace(/`([^`\n]+)`/g, (_, code) => hold(`<code>${escapeHtml(unslack(code))}</code>`));
  out = out.replace(/<([^<>\n]+)>/g, (_, inner) => hold(token(inner, ctx)));
  out = escapeHtml(unslack(out));
  out = out.replace(/(^|[^\w*])\*(?=\S)([^*\n]*?\S)\*(?!\w)/g, "$1<b>$2</b>");
  out = out.replace(/(^|[^\w_])_(?=\S)([^_\n]*?\S)_(?!\w)/g, "$1<i>$2</i>");
  out = out.replace(/(^|[^\w~])~(?=\S)([^~\n]*?\S)~(?!\w)/g, "$1<s>$2</s>");
  out = out.replace(/:([a-z0-9_+-]+):/g, (whole, name) => EMOJI[name] || whole);
  out = out.replace(/\u0000(\d+)\u0000/g, (_, n) => held[Number(n)]);
  return out;
}

function lines(text, ctx) {
  const html = [];
  let quote = [];
  const flush = () => {
    if (quote.length) html.push(`<blockquote>${quote.join("<br>")}</blockquote>`);
    quote = [];
  };
  const rows = text.split("\n");
  rows.forEach((row, index) => {
    if (row.startsWith("&gt;")) {
      quote.push(inline(row.replace(/^&gt;\s?/, ""), ctx));
      return;
    }
    flush();
    html.push(inline(row, ctx) + (index < rows.length - 1 ? "<br>" : ""));
  });
  flush();
  return html.join("");
}

// mrkdwn text -> HTML. ctx: { names: {U…: name}, channels: {C…: name}, now: Date }.
export function mrkdwn(text, ctx) {
  return String(text || "")
    .split("```")
    .map((part, index) =>
      index % 2 ? `<pre>${escapeHtml(unslack(part.replace(/^\n/, "")))}</pre>` : lines(part, ctx))
    .join("");
}

// plain_text objects: escaped, emoji names shown as emoji when `emoji` is set.
export function plainText(object) {
  const text = escapeHtml(object && object.text ? object.text : "");
  if (object && object.emoji === false) return text;
  return text.replace(/:([a-z0-9_+-]+):/g, (whole, name) => EMOJI[name] || whole);
}

export function textObject(object, ctx) {
  if (!object) return "";
  return object.type === "mrkdwn" ? mrkdwn(object.text, ctx) : plainText(object);
}
