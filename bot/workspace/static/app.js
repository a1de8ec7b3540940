// The workspace page: polls /ui/state once a second and draws the sidebar, the conversation
// or App Home, the open modal and the fleet; what a person does goes to /ui/* as JSON, where
// the server turns it into a signed Slack request to the bot.

import { confirmText, h, renderBlocks } from "./blocks.js";
import { renderClock, renderFleet } from "./fleet.js";
import { mrkdwn } from "./mrkdwn.js";

const HOME = "home";
const DM = "dm";  // "the acting person's DM with the bot", whoever that is
const params = new URLSearchParams(location.search);
const ui = {
  me: params.get("as") || "U0ALICE01",
  where: params.get("in") || "C0GPU",
  state: null,
  drawn: {},       // what each pane last drew, to leave untouched panes (and inputs) alone
  seen: {},        // "person/conversation" -> messages seen, for the unread marks
  errors: {},      // field errors of the open modal, from its last submit
  modal: null,     // the modal drawn last: its id, hash and input readers
  timer: null,
};
const $ = (id) => document.getElementById(id);
const fill = (node, ...children) => node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined));

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
      const count = conv.messages.length;
      const seen = ui.seen[`${ui.me}/${conv.id}`];
      const unread = seen !== undefined && count > seen && conv.id !== ui.where;
      const prefix = conv.kind === "channel" ? (conv.private ? "🔒 " : "# ") : "● ";
      items.push(h("a", {
        href: "#", class: `nav-item${conv.id === ui.where ? " active" : ""}${unread ? " unread" : ""}`,
        "data-conversation": conv.id, onclick: (e) => { e.preventDefault(); go(conv.id); },
      }, prefix + label(conv)));
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

function messageRow(item, conv) {
  const who = author(item);
  const ctx = context();
  const source = item.ephemeral
    ? { kind: "ephemeral", ts: item.ts, channel: conv.id }
    : { kind: "message", ts: item.ts, channel: conv.id };
  ctx.act = (action) => post("/ui/action", { as: ui.me, source, ...action });
  ctx.confirm = (dialog) => confirm(dialog, ctx);
  const time = new Intl.DateTimeFormat(undefined, { hour: "numeric", minute: "2-digit" })
    .format(new Date(Number(item.ts) * 1000));
  const body = item.blocks && item.blocks.length
    ? renderBlocks(item.blocks, ctx)
    : h("div", { class: "b-text", html: mrkdwn(item.text, ctx) });
  return h("div", { class: `message${item.ephemeral ? " ephemeral" : ""}`, "data-ts": item.ts },
    item.ephemeral ? h("div", { class: "only-you" }, "👁 Only visible to you") : null,
    h("div", { class: "message-row" },
      h("div", { class: `avatar${who.bot ? " bot" : ""}` }, who.initials),
      h("div", { class: "message-main" },
        h("div", { class: "message-head" },
          h("span", { class: "author" }, who.name),
          who.bot ? h("span", { class: "app-badge" }, "APP") : null,
          h("span", { class: "time" }, time),
          item.edited ? h("span", { class: "edited" }, "(edited)") : null),
        body)));
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
  ui.seen[`${ui.me}/${conv.id}`] = conv.messages.length;
  $("text").placeholder = `Message ${conv.kind === "channel" ? "#" + conv.name : "gpubot"} — try /gpu help`;
  const key = JSON.stringify([conv.id, conv.messages, Math.floor(ui.state.clock.now / 60)]);
  if (ui.drawn.messages === key) return;
  ui.drawn.messages = key;
  const list = $("messages");
  const atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 80;
  const rows = conv.messages.map((item) => messageRow(item, conv));
  list.replaceChildren(...(rows.length ? rows : [h("div", { class: "empty" }, "No messages yet.")]));
  if (atBottom || !ui.drawn.scrolled) list.scrollTop = list.scrollHeight;
  ui.drawn.scrolled = true;
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
  const key = JSON.stringify([ui.state.clock, ui.state.fleet]);
  if (ui.drawn.panel === key) return;
  ui.drawn.panel = key;
  const forward = (minutes) => post("/ui/forward", { minutes });
  fill($("panel"), renderClock(ui.state.clock, forward),
    renderFleet(ui.state.fleet, ui.state.names, ui.state.clock.now));
}

function draw() {
  if (!ui.state) return;
  const person = ui.state.people.find((p) => p.id === ui.me);
  $("role").textContent = person ? person.role : "";
  drawPeople();
  drawSidebar();
  drawMain();
  drawModal();
  drawPanel();
}

async function refresh() {
  clearTimeout(ui.timer);
  try {
    const response = await fetch(`/ui/state?as=${encodeURIComponent(ui.me)}`);
    ui.state = await response.json();
    ui.me = ui.state.me;
    document.body.dataset.ready = "yes";
    document.body.dataset.person = ui.me;
    draw();
  } catch (error) {
    $("title").textContent = "The demo is not answering; is `gpubot demo` still running?";
  }
  ui.timer = setTimeout(refresh, 1000);
}

function refreshSoon() {
  clearTimeout(ui.timer);
  ui.timer = setTimeout(refresh, 150);
}

$("person").addEventListener("change", (event) => {
  const current = ui.state && conversation();
  ui.me = event.target.value;
  ui.state = null;  // nothing of the last person's view is drawn for the next one
  delete document.body.dataset.person;
  ui.errors = {};
  ui.drawn = {};
  if (current && current.kind === "dm") ui.where = DM;
  remember();
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

if (ui.where === HOME) post("/ui/home", { as: ui.me });
refresh();
