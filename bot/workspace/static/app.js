// The workspace page: polls /ui/state once a second and draws the sidebar, the conversation
// (day dividers, grouped messages, threads) or App Home, the open thread, the open modal and
// the fleet; what a person does goes to /ui/* as JSON, where the server turns it into a signed
// Slack request to the bot.

import { confirmText, h, renderBlocks } from "./blocks.js";
import { keepEmojiReadable } from "./emoji.js";
import { renderClock, renderFleet } from "./fleet.js";
import { formatDate, mrkdwn } from "./mrkdwn.js";

const HOME = "home";
const DM = "dm";  // "the acting person's DM with the bot", whoever that is
const params = new URLSearchParams(location.search);
const ui = {
  me: params.get("as") || "U0ALICE01",
  where: params.get("in") || "C0GPU",
  state: null,
  drawn: {},       // what each pane last drew, to leave untouched panes (and inputs) alone
  thread: null,    // the open thread: { channel, ts } of its parent
  forwardError: null,
  errors: {},      // field errors of the open modal, from its last submit
  modal: null,     // the modal drawn last: its id, hash and input readers
  timer: null,
};
const $ = (id) => document.getElementById(id);
const fill = (node, ...children) => node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));
const GROUP_S = 5 * 60;  // a message within five minutes of its author's last one joins it

async function post(path, body) {
  const response = await fetch(path, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  const answer = await response.json().catch(() => ({ ok: false, error: response.statusText }));
  if (!answer.ok) toast(answer.error || "something went wrong");
  refreshSoon();
  return answer;
}

function toast(text) {
  const node = $("toast");
  node.textContent = `⚠️ ${text}`;
  node.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { node.hidden = true; }, 6000);
}

function context() {
  const state = ui.state;
  const channels = Object.fromEntries(state.conversations.map((c) => [c.id, c.name]));
  return { names: state.names, channels, now: new Date(state.clock.now * 1000), inputs: {} };
}

function remember() {
  history.replaceState(null, "", `?${new URLSearchParams({ as: ui.me, in: ui.where })}`);
}

function go(where) {
  if (where !== ui.where) ui.thread = null;
  ui.where = where;
  remember();
  ui.drawn = {};
  if (where === HOME) post("/ui/home", { as: ui.me });
  draw();
}

function conversation() {
  return ui.state.conversations.find((c) => c.id === ui.where);
}

function dm() {
  return ui.state.conversations.find((c) => c.kind === "dm");
}

function label(conv) {
  if (conv.kind === "dm") return "gpubot";
  if (conv.kind === "group") return conv.members.map((m) => ui.state.names[m]).join(", ");
  return conv.name;
}

function drawPeople() {
  const select = $("person");
  const key = JSON.stringify([ui.state.people, ui.me]);
  if (ui.drawn.people === key) return;
  ui.drawn.people = key;
  select.replaceChildren(...ui.state.people.map((p) =>
    h("option", { value: p.id, selected: p.id === ui.me }, `${p.name} (${p.role})`)));
}

function drawSidebar() {
  const items = [];
  const section = (title, convs) => {
    if (!convs.length) return;
    items.push(h("div", { class: "nav-title" }, title));
    for (const conv of convs) {
      const unread = conv.id === ui.where ? 0 : conv.unread;
      const prefix = conv.kind === "channel" ? (conv.private ? "🔒 " : "# ") : "● ";
      items.push(h("a", {
        href: "#", class: `nav-item${conv.id === ui.where ? " active" : ""}${unread ? " unread" : ""}`,
        "data-conversation": conv.id, onclick: (e) => { e.preventDefault(); go(conv.id); },
      }, h("span", { class: "nav-label" }, prefix + label(conv)),
      unread ? h("span", { class: "badge", "aria-label": `${unread} unread` }, String(unread)) : null));
    }
  };
  const convs = ui.state.conversations;
  section("Channels", convs.filter((c) => c.kind === "channel"));
  section("Direct messages", convs.filter((c) => c.kind !== "channel"));
  items.push(h("div", { class: "nav-title" }, "Apps"));
  items.push(h("a", {
    href: "#", class: `nav-item app${ui.where === HOME ? " active" : ""}`, "data-conversation": HOME,
    onclick: (e) => { e.preventDefault(); go(HOME); },
  }, "⚡ gpubot · Home"));
  fill($("nav"), ...items);
}

function author(item) {
  const bot = item.user === ui.state.bot;
  const name = bot ? "gpubot" : ui.state.names[item.user] || item.user;
  return { bot, name, initials: bot ? "⚡" : name.split(" ").map((w) => w[0]).join("").slice(0, 2) };
}

function clockTime(ts) {
  return new Intl.DateTimeFormat(undefined, { hour: "numeric", minute: "2-digit" })
    .format(new Date(Number(ts) * 1000));
}

function openThread(conv, ts) {
  ui.thread = { channel: conv.id, ts };
  ui.drawn.thread = null;
  draw();
}

// Under a parent: "N replies", the time of the last one; it opens the thread pane.
function repliesLink(item, conv) {
  if (!item.reply_count) return null;
  const when = formatDate(Number(item.latest_reply), "{date_short_pretty} at {time}", new Date(ui.state.clock.now * 1000));
  return h("button", { type: "button", class: "replies", "data-thread": item.ts, onclick: () => openThread(conv, item.ts) },
    h("span", { class: "count" }, `${item.reply_count} ${item.reply_count === 1 ? "reply" : "replies"}`),
    h("span", { class: "last" }, `Last reply ${when}`));
}

// A thread reply seen outside its thread: in the channel ("replied to a thread") or, in the
// thread pane, one that was "also sent to the channel".
function threadNote(item, conv, inThread) {
  if (!item.broadcast) return null;
  if (inThread) return h("div", { class: "thread-note" }, "also sent to the channel");
  return h("div", { class: "thread-note" }, "replied to a thread: ",
    h("a", { onclick: () => openThread(conv, item.thread_ts) }, "view thread"));
}

function fileSize(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KB`;
  return `${(bytes / 1024 / 1024).toFixed(1)} MB`;
}

// Files shared with the message, served by the page: an image drawn inline (a click opens it
// full size in a new tab), anything else a chip with its name, size and a download link.
function sharedFiles(item) {
  if (!item.files || !item.files.length) return null;
  return h("div", { class: "files" }, item.files.map((f) => f.image
    ? h("a", { class: "file-image", href: f.url, target: "_blank", rel: "noopener", title: f.title },
      h("img", { src: f.url, alt: f.title, "data-file-id": f.id }))
    : h("div", { class: "file-chip", "data-file-id": f.id },
      h("span", { class: "file-icon" }, (f.filetype || "file").toUpperCase()),
      h("span", { class: "file-about" },
        h("span", { class: "file-name" }, f.title || f.name),
        h("span", { class: "file-size" }, `${fileSize(f.size)} · ${f.name}`)),
      h("a", { class: "file-download", href: f.url, download: f.name }, "Download"))));
}

// `grouped`: the author's previous message is just above and recent, so no name or avatar.
function messageRow(item, conv, { grouped = false, inThread = false } = {}) {
  const who = author(item);
  const ctx = context();
  const source = item.ephemeral
    ? { kind: "ephemeral", ts: item.ts, channel: conv.id }
    : { kind: "message", ts: item.ts, channel: conv.id };
  ctx.act = (action) => post("/ui/action", { as: ui.me, source, ...action });
  ctx.confirm = (dialog) => confirm(dialog, ctx);
  const time = clockTime(item.ts);
  const text = item.blocks && item.blocks.length
    ? renderBlocks(item.blocks, ctx)
    : item.text || !item.files || !item.files.length ? h("div", { class: "b-text", html: mrkdwn(item.text, ctx) }) : null;
  const body = h("div", { class: "message-body" }, text, sharedFiles(item));
  const main = grouped
    ? [h("div", { class: "gutter" }, time), h("div", { class: "message-main" },
      item.edited ? h("span", { class: "edited" }, "(edited)") : null, body, inThread ? null : repliesLink(item, conv))]
    : [h("div", { class: `avatar${who.bot ? " bot" : ""}` }, who.initials),
      h("div", { class: "message-main" },
        h("div", { class: "message-head" },
          h("span", { class: "author" }, who.name),
          who.bot ? h("span", { class: "app-badge" }, "APP") : null,
          h("span", { class: "time" }, time),
          item.edited ? h("span", { class: "edited" }, "(edited)") : null),
        body, inThread ? null : repliesLink(item, conv))];
  return h("div", {
    class: `message${item.ephemeral ? " ephemeral" : ""}${grouped ? " grouped" : ""}`,
    "data-ts": item.ts, "data-author": item.user,
  },
  item.ephemeral ? h("div", { class: "only-you" }, "👁 Only visible to you") : null,
  threadNote(item, conv, inThread),
  h("div", { class: "message-row" }, ...main));
}

function dayOf(ts) {
  const date = new Date(Number(ts) * 1000);
  return `${date.getFullYear()}-${date.getMonth()}-${date.getDate()}`;
}

function dayDivider(ts) {
  const text = formatDate(Number(ts), "{date_long_pretty}", new Date(ui.state.clock.now * 1000));
  return h("div", { class: "day", role: "separator" }, h("span", {}, text.charAt(0).toUpperCase() + text.slice(1)));
}

// Messages with a divider before each new day; a message follows its author's last one
// without name or avatar when nothing else came between and it is within GROUP_S.
// In a thread, `after` is the parent: a reply on the parent's day needs no divider.
function messageRows(items, conv, inThread, after = null) {
  const rows = [];
  let previous = null;
  for (const item of items) {
    const newDay = dayOf((previous || after || { ts: 0 }).ts) !== dayOf(item.ts);
    if (newDay) rows.push(dayDivider(item.ts));
    const grouped = !newDay && previous !== null && previous.user === item.user && previous.ephemeral === item.ephemeral
      && !item.ephemeral && !item.broadcast && !previous.reply_count
      && Number(item.ts) - Number(previous.ts) < GROUP_S;
    rows.push(messageRow(item, conv, { grouped, inThread }));
    previous = item;
  }
  return rows;
}

function drawMain() {
  if (ui.where === DM) { go(dm().id); return; }
  const conv = ui.where === HOME ? null : conversation();
  if (ui.where !== HOME && !conv) { go("C0GPU"); return; }
  const appTabs = ui.where === HOME || (conv && conv.kind === "dm");
  fill($("title"),
    h("span", { class: "title-name" }, conv ? (conv.kind === "channel" ? `${conv.private ? "🔒" : "#"} ${conv.name}` : label(conv)) : "gpubot"),
    appTabs ? h("span", { class: "tabs" },
      h("a", { href: "#", class: `tab${ui.where === HOME ? " active" : ""}`, onclick: (e) => { e.preventDefault(); go(HOME); } }, "Home"),
      h("a", { href: "#", class: `tab${ui.where !== HOME ? " active" : ""}`, onclick: (e) => { e.preventDefault(); go(dm().id); } }, "Messages"))
      : null);
  $("composer").hidden = ui.where === HOME;
  $("messages").hidden = ui.where === HOME;
  $("home").hidden = ui.where !== HOME;
  if (ui.where === HOME) return drawHome();
  $("text").placeholder = `Message ${conv.kind === "channel" ? "#" + conv.name : "gpubot"} — try /gpu help`;
  const key = JSON.stringify([conv.id, conv.messages, Math.floor(ui.state.clock.now / 60)]);
  if (ui.drawn.messages === key) return;
  ui.drawn.messages = key;
  const list = $("messages");
  const atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 80;
  const rows = messageRows(conv.messages, conv, false);
  list.replaceChildren(...(rows.length ? rows : [h("div", { class: "empty" }, "No messages yet.")]));
  // A channel opens at its newest message; a new one scrolls into view if the reader was there.
  if (atBottom || !ui.drawn.scrolled) list.scrollTop = list.scrollHeight;
  ui.drawn.scrolled = true;
}

function drawThread() {
  const pane = $("thread");
  const conv = ui.thread && ui.state.conversations.find((c) => c.id === ui.thread.channel);
  const parent = conv && conv.messages.find((m) => m.ts === ui.thread.ts);
  if (!parent || ui.where !== conv.id) ui.thread = null;
  $("fleet").hidden = Boolean(ui.thread);
  pane.hidden = !ui.thread;
  if (!ui.thread) { ui.drawn.thread = null; fill(pane); return; }
  const replies = conv.threads[parent.ts] || [];
  const key = JSON.stringify([parent, replies, Math.floor(ui.state.clock.now / 60)]);
  if (ui.drawn.thread === key) return;
  const body = pane.querySelector(".thread-body");
  const atBottom = !body || body.scrollHeight - body.scrollTop - body.clientHeight < 80;
  ui.drawn.thread = key;
  const close = () => { ui.thread = null; ui.drawn.thread = null; draw(); };
  const list = h("div", { class: "thread-body" },
    messageRow(parent, conv, { inThread: true }),
    h("div", { class: "thread-count" }, `${replies.length} ${replies.length === 1 ? "reply" : "replies"}`),
    messageRows(replies, conv, true, parent));
  fill(pane,
    h("div", { class: "thread-head" },
      h("span", {}, "Thread", h("span", { class: "where" }, conv.kind === "channel" ? `#${conv.name}` : label(conv))),
      h("button", { type: "button", class: "close-x", "aria-label": "Close thread", onclick: close }, "×")),
    list);
  if (atBottom) list.scrollTop = list.scrollHeight;
}

function drawHome() {
  const view = ui.state.home;
  const key = JSON.stringify([view && view.hash, Math.floor(ui.state.clock.now / 60)]);
  if (ui.drawn.home === key) return;
  ui.drawn.home = key;
  if (!view) { fill($("home"), h("div", { class: "empty" }, "Opening the Home tab…")); return; }
  const ctx = context();
  ctx.act = (action) => post("/ui/action", { as: ui.me, source: { kind: "view", view_id: view.id }, ...action });
  ctx.confirm = (dialog) => confirm(dialog, ctx);
  fill($("home"), h("div", { class: "home-view" }, renderBlocks(view.blocks, ctx)));
}

function drawModal() {
  const view = ui.state.modal;
  const key = JSON.stringify([view && view.id, view && view.hash, ui.errors]);
  if (ui.drawn.modal === key) return;
  ui.drawn.modal = key;
  const layer = $("modal-layer");
  if (!view) { layer.hidden = true; fill(layer); return; }
  const ctx = context();
  ctx.errors = ui.errors[view.id] || {};
  // A redraw of the same view (its errors changed) keeps what the person typed, as Slack does.
  const same = ui.modal && ui.modal.id === view.id && ui.modal.hash === view.hash;
  ctx.values = same ? Object.fromEntries(Object.entries(ui.modal.inputs).map(([id, read]) => [id, read()])) : {};
  ui.modal = { id: view.id, hash: view.hash, inputs: ctx.inputs };
  ctx.act = (action) => post("/ui/action", { as: ui.me, source: { kind: "view", view_id: view.id }, ...action });
  ctx.confirm = (dialog) => confirm(dialog, ctx);
  const blocks = renderBlocks(view.blocks, ctx);
  const submit = async (event) => {
    event.preventDefault();
    const values = Object.fromEntries(Object.entries(ctx.inputs).map(([id, read]) => [id, read()]));
    const answer = await post("/ui/submit", { as: ui.me, view_id: view.id, values });
    ui.errors = answer.errors ? { [view.id]: answer.errors } : {};
    ui.drawn.modal = null;
  };
  const cancel = () => { ui.errors = {}; post("/ui/close", { as: ui.me, view_id: view.id }); };
  fill(layer, h("form", { class: "modal", role: "dialog", "aria-label": view.title.text, onsubmit: submit },
    h("div", { class: "modal-title" }, view.title.text,
      h("button", { type: "button", class: "close-x", "aria-label": "Close", onclick: cancel }, "×")),
    h("div", { class: "modal-body" }, blocks),
    h("div", { class: "modal-foot" },
      h("button", { type: "button", class: "btn", onclick: cancel }, view.close ? view.close.text : "Cancel"),
      view.submit ? h("button", { type: "submit", class: "btn primary" }, view.submit.text) : null)));
  layer.hidden = false;
}

function confirm(dialog, ctx) {
  const text = confirmText(dialog, ctx);
  const layer = $("confirm-layer");
  return new Promise((resolve) => {
    const done = (answer) => { layer.hidden = true; fill(layer); resolve(answer); };
    fill(layer, h("div", { class: "modal confirm", role: "alertdialog" },
      h("div", { class: "modal-title", html: text.title }),
      h("div", { class: "modal-body", html: text.text }),
      h("div", { class: "modal-foot" },
        h("button", { type: "button", class: "btn", onclick: () => done(false), html: text.no }),
        h("button", { type: "button", class: `btn ${text.danger ? "danger" : "primary"}`, onclick: () => done(true), html: text.yes }))));
    layer.hidden = false;
  });
}

function drawPanel() {
  const clock = ui.state.clock;
  if (clock.forward_error && clock.forward_error !== ui.forwardError) toast(`fast-forward stopped: ${clock.forward_error}`);
  ui.forwardError = clock.forward_error;
  const key = JSON.stringify(clock);
  if (ui.drawn.clock !== key) {
    ui.drawn.clock = key;
    const forward = (minutes) => post("/ui/forward", { minutes });
    fill($("clock"), renderClock(clock, forward));
  }
  const fleet = JSON.stringify([clock.now, ui.state.fleet]);
  if (ui.drawn.fleet !== fleet && !ui.thread) {
    ui.drawn.fleet = fleet;
    fill($("fleet"), renderFleet(ui.state.fleet, ui.state.names, clock.now));
  }
}

function draw() {
  if (!ui.state) return;
  const person = ui.state.people.find((p) => p.id === ui.me);
  $("role").textContent = person ? person.role : "";
  drawPeople();
  drawSidebar();
  drawMain();
  drawThread();
  drawModal();
  drawPanel();
}

async function refresh() {
  clearTimeout(ui.timer);
  try {
    const reading = ui.where === HOME || ui.where === DM ? "" : ui.where;
    const asked = ui.me;
    const query = new URLSearchParams({ as: asked, in: reading });
    const response = await fetch(`/ui/state?${query}`);
    const state = await response.json();
    // The person was switched while this view was on its way: it is the last person's, and
    // taking it would switch back. The switch has asked for the new person's own.
    if (ui.me !== asked) return;
    ui.state = state;
    ui.me = ui.state.me;
    document.body.dataset.ready = "yes";
    document.body.dataset.person = ui.me;
    draw();
    // what the browser tests wait on: the last fast-forward done and drawn
    document.body.dataset.forwarded = String(ui.state.clock.forwards_done);
  } catch (error) {
    $("title").textContent = "The demo is not answering; is `gpubot demo` still running?";
  }
  ui.timer = setTimeout(refresh, 1000);
}

function refreshSoon() {
  clearTimeout(ui.timer);
  ui.timer = setTimeout(refresh, 150);
}

$("person").addEventListener("change", async (event) => {
  const current = ui.state && conversation();
  const before = ui.me;
  ui.me = event.target.value;
  ui.state = null;  // nothing of the last person's view is drawn for the next one
  delete document.body.dataset.person;
  ui.errors = {};
  ui.drawn = {};
  ui.thread = null;
  if (current && current.kind === "dm") ui.where = DM;
  remember();
  // A modal belongs to the window it was opened in: switching person closes both people's.
  await Promise.all([leave(before), leave(ui.me)]);
  if (ui.where === HOME) post("/ui/home", { as: ui.me });
  refreshSoon();
});

$("composer").addEventListener("submit", async (event) => {
  event.preventDefault();
  const input = $("text");
  const text = input.value.trim();
  if (!text) return;
  const answer = await post("/ui/command", { as: ui.me, channel: ui.where, text });
  if (answer.ok) input.value = "";
});

function leave(person) {
  return fetch("/ui/leave", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ as: person }),
  }).catch(() => null);
}

keepEmojiReadable(document.body);
// A reload is a new window: the modal the person had open is gone, as in Slack.
leave(ui.me).then(() => {
  if (ui.where === HOME) post("/ui/home", { as: ui.me });
  refresh();
});
