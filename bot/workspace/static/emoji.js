// Emoji on hosts without an emoji font: each pictograph is drawn on a canvas once and compared
// with a code point no font has; one that comes out as that same box is replaced by a short
// plain-text badge, so nothing on the page is drawn as tofu. Where the font has it, it stays.

// The emoji the bot and the page use, as [text, tone]; any other becomes a neutral "*", and an
// empty text (a decoration of the page's own) draws nothing.
const FALLBACK = {
  "✅": ["ok", "good"], "✔": ["ok", "good"], "🎉": ["yay", "good"], "🚀": ["go", "good"],
  "🏁": ["end", "info"], "⚠": ["!", "warn"], "⌛": ["wait", "warn"], "⏱": ["time", "warn"],
  "🕒": ["time", "info"], "🔔": ["ping", "warn"], "🔥": ["hot", "bad"], "💤": ["zz", "warn"],
  "⛔": ["no", "bad"], "❌": ["x", "bad"], "ℹ": ["i", "info"], "♻": ["back", "info"],
  "👀": ["look", "info"], "👁": ["", ""], "📥": ["in", "info"], "⏸": ["||", "warn"],
  "⏩": [">>", ""], "🔒": ["lock", ""], "⚡": ["bot", ""], "🖼": ["img", ""],
  "⏳": ["wait", "warn"], "↩": ["back", "info"], "▶": [">", "good"],
  "⬇": ["v", "info"],
};
// Extended pictographs with an optional variation selector, and keycaps such as 1️⃣.
const PICTOGRAPH = /(?:\p{Extended_Pictographic}|[0-9#*]\uFE0F?\u20E3)\uFE0F?/gu;
const NOWHERE = "\u{10FFFD}";  // a private-use code point: every host draws it as the missing box
const SKIP = new Set(["SCRIPT", "STYLE", "TEXTAREA", "INPUT"]);
const known = new Map();
let canvas = null;

function pixels(text) {
  if (!canvas) {
    canvas = document.createElement("canvas");
    canvas.width = 48;
    canvas.height = 32;
  }
  const g = canvas.getContext("2d", { willReadFrequently: true });
  g.clearRect(0, 0, canvas.width, canvas.height);
  g.font = `24px ${getComputedStyle(document.body).fontFamily}`;
  g.textBaseline = "top";
  g.fillStyle = "#000";
  g.fillText(text, 2, 2);
  return { width: Math.round(g.measureText(text).width), data: g.getImageData(0, 0, canvas.width, canvas.height).data };
}

// Whether this browser has a glyph for `emoji` (drawn unlike the missing box).
export function drawable(emoji) {
  if (!known.has(emoji)) {
    const missing = pixels(NOWHERE);
    const drawn = pixels(emoji);
    const same = drawn.width === missing.width && drawn.data.every((v, i) => v === missing.data[i]);
    known.set(emoji, !same && drawn.data.some((v) => v !== 0));
  }
  return known.get(emoji);
}

function fallback(emoji) {
  const base = emoji.replace(/[\uFE0F\u20E3]/g, "");
  return FALLBACK[base] || (/^[0-9#*]$/.test(base) ? [base, "info"] : ["*", ""]);
}

function replaceIn(node) {
  const text = node.nodeValue;
  if (!text || !text.match(PICTOGRAPH)) return;
  const parent = node.parentNode;
  if (!parent || SKIP.has(parent.nodeName) || parent.closest(".emoji-text")) return;
  const inOption = parent.nodeName === "OPTION" || parent.nodeName === "SELECT";
  const parts = [];
  let last = 0;
  let changed = false;
  for (const match of text.matchAll(PICTOGRAPH)) {
    if (drawable(match[0])) continue;
    changed = true;
    parts.push(text.slice(last, match.index));
    const [label, tone] = fallback(match[0]);
    if (inOption) {
      parts.push(`[${label}]`);
    } else {
      const badge = document.createElement("span");
      badge.className = `emoji-text${tone ? ` ${tone}` : ""}`;
      badge.dataset.emoji = match[0];
      badge.textContent = label;
      parts.push(badge);
    }
    last = match.index + match[0].length;
  }
  if (!changed) return;
  parts.push(text.slice(last));
  if (inOption) node.nodeValue = parts.join("");
  else node.replaceWith(...parts.filter((p) => p !== ""));
}

// Replace what cannot be drawn under `root`, now and whenever something is added below it.
export function keepEmojiReadable(root) {
  const sweep = (node) => {
    if (node.nodeType === Node.TEXT_NODE) { replaceIn(node); return; }
    if (node.nodeType !== Node.ELEMENT_NODE) return;
    const walker = document.createTreeWalker(node, NodeFilter.SHOW_TEXT);
    const found = [];
    while (walker.nextNode()) found.push(walker.currentNode);
    found.forEach(replaceIn);
  };
  sweep(root);
  new MutationObserver((records) => {
    for (const record of records) {
      if (record.type === "characterData") sweep(record.target);
      else record.addedNodes.forEach(sweep);
    }
  }).observe(root, { childList: true, subtree: true, characterData: true });
}
