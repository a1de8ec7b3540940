// Block Kit as Slack draws it: header, section (text, fields, accessory), context, divider,
// actions (buttons with primary/danger styles and confirm dialogs, selects), input blocks
// (plain_text_input, number_input, static_select, datepicker). Unknown blocks show as JSON,
// so nothing is silently hidden. No image is fetched: the page never reaches the internet.

import { escapeHtml, plainText, textObject } from "./mrkdwn.js";

export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "html") node.innerHTML = value;
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined && child !== false) {
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
  }
  return node;
}

function options(element) {
  const flat = [...(element.options || [])];
  for (const group of element.option_groups || []) flat.push(...(group.options || []));
  return flat;
}

function select(element, onChange) {
  const chosen = element.initial_option ? element.initial_option.value : "";
  const placeholder = element.placeholder ? element.placeholder.text : "Select an item";
  const node = h("select", { class: "select", "data-action-id": element.action_id },
    h("option", { value: "", disabled: true, selected: !chosen }, placeholder),
    options(element).map((o) => h("option", { value: o.value, selected: o.value === chosen },
      o.text ? o.text.text : o.value)));
  if (onChange) node.addEventListener("change", () => onChange(node.value));
  return node;
}

function button(element, blockId, ctx) {
  const style = element.style ? ` ${element.style}` : "";
  const click = async () => {
    if (element.confirm && !(await ctx.confirm(element.confirm))) return;
    ctx.act({ action_id: element.action_id, block_id: blockId, value: element.value });
  };
  return h("button", {
    type: "button", class: `btn${style}`, "data-action-id": element.action_id, onclick: click,
    html: plainText(element.text),
  });
}

// An interactive element outside an input block: it acts as soon as it is used.
function interactive(element, blockId, ctx) {
  const act = (value) => ctx.act({ action_id: element.action_id, block_id: blockId, value });
  switch (element.type) {
    case "button":
      return button(element, blockId, ctx);
    case "static_select":
    case "overflow":
      return select(element, act);
    case "datepicker":
      return h("input", { type: "date", value: element.initial_date, onchange: (e) => act(e.target.value) });
    case "image":
      return h("span", { class: "image", title: element.alt_text }, "🖼");
    default:
      return h("pre", { class: "unknown-block" }, JSON.stringify(element, null, 1));
  }
}

// An input block's element; ctx.inputs[action_id] reads its value at submit, and
// ctx.values[action_id] (what the person had typed before a redraw) wins over the initial value.
function field(element, ctx) {
  const id = element.action_id;
  const typed = ctx.values ? ctx.values[id] : undefined;
  let node;
  if (element.type === "plain_text_input") {
    const attrs = {
      id: `input-${id}`, name: id, "data-action-id": id, maxlength: element.max_length,
      placeholder: element.placeholder ? element.placeholder.text : undefined,
    };
    node = element.multiline ? h("textarea", { ...attrs, rows: 3 }) : h("input", { ...attrs, type: "text" });
    node.value = element.initial_value || "";
  } else if (element.type === "number_input") {
    node = h("input", {
      id: `input-${id}`, name: id, "data-action-id": id, type: "number",
      step: element.is_decimal_allowed ? "any" : "1", min: element.min_value, max: element.max_value,
    });
    node.value = element.initial_value || "";
  } else if (element.type === "static_select") {
    node = select(element, null);
    node.id = `input-${id}`;
  } else if (element.type === "datepicker") {
    node = h("input", { id: `input-${id}`, type: "date", "data-action-id": id });
    node.value = element.initial_date || "";
  } else {
    return h("pre", { class: "unknown-block" }, JSON.stringify(element, null, 1));
  }
  if (typed !== undefined) node.value = typed;
  ctx.inputs[id] = () => node.value;
  return node;
}

const RENDER = {
  header: (block) => h("div", { class: "b-header", html: plainText(block.text) }),
  divider: () => h("hr", { class: "b-divider" }),
  context: (block, ctx) => h("div", { class: "b-context" },
    (block.elements || []).map((e) => e.type === "image"
      ? h("span", { class: "image", title: e.alt_text }, "🖼")
      : h("span", { html: textObject(e, ctx) }))),
  section: (block, ctx, blockId) => h("div", { class: "b-section" },
    h("div", { class: "b-section-body" },
      block.text ? h("div", { class: "b-text", html: textObject(block.text, ctx) }) : null,
      block.fields ? h("div", { class: "b-fields" },
        block.fields.map((f) => h("div", { class: "b-field", html: textObject(f, ctx) }))) : null),
    block.accessory ? h("div", { class: "b-accessory" }, interactive(block.accessory, blockId, ctx)) : null),
  actions: (block, ctx, blockId) => h("div", { class: "b-actions" },
    (block.elements || []).map((e) => interactive(e, blockId, ctx))),
  input: (block, ctx, blockId) => {
    const error = ctx.errors && ctx.errors[blockId];
    const id = block.element ? `input-${block.element.action_id}` : undefined;
    return h("div", { class: `b-input${error ? " has-error" : ""}`, "data-block-id": blockId },
      h("label", { for: id },
        h("span", { html: plainText(block.label) }),
        block.optional ? h("span", { class: "optional" }, " (optional)") : null),
      field(block.element || {}, ctx),
      block.hint ? h("div", { class: "hint", html: plainText(block.hint) }) : null,
      error ? h("div", { class: "error", role: "alert" }, error) : null);
  },
};

// blocks -> a <div>; ctx: { names, channels, now, act(action), confirm(dialog) -> Promise<bool>,
// inputs: {}, errors: {block_id: text} }. Block ids missing in the JSON are b<index>, as the
// local Slack API names them.
export function renderBlocks(blocks, ctx) {
  return h("div", { class: "blocks" }, (blocks || []).map((block, index) => {
    const blockId = block.block_id || `b${index}`;
    const render = RENDER[block.type];
    if (!render) return h("pre", { class: "unknown-block", title: "a block this page cannot draw" }, JSON.stringify(block, null, 1));
    return render(block, ctx, blockId);
  }));
}

export function confirmText(dialog, ctx) {
  return {
    title: dialog.title ? escapeHtml(dialog.title.text) : "Are you sure?",
    text: textObject(dialog.text, ctx),
    yes: dialog.confirm ? escapeHtml(dialog.confirm.text) : "Yes",
    no: dialog.deny ? escapeHtml(dialog.deny.text) : "Cancel",
    danger: dialog.style === "danger",
  };
}
