// The page's entry point: reads /api/info once, then shows one view at a time behind keyboard-usable tabs.
// A view is built the first time its tab opens (so the page starts with one request, not six) and
// keeps its state when the user switches away and back. The URL hash names the open view (#masking).

import { getJSON, say } from "./api.js";
import { fmtInt, fmtShare } from "./charts.js";
import * as visibility from "./visibility.js";
import * as assembly from "./assembly.js";
import * as masking from "./masking.js";
import * as fillmask from "./fillmask.js";
import * as attention from "./attention.js";
import * as tasks from "./tasks.js";

const VIEWS = { visibility, assembly, masking, fillmask, attention, tasks };
const mounted = new Set();
let info = null;

const tabs = () => [...document.querySelectorAll('[role="tab"]')];

function open(name, { focus = false } = {}) {
  if (!(name in VIEWS)) name = "visibility";
  for (const tab of tabs()) {
    const active = tab.dataset.view === name;
    tab.setAttribute("aria-selected", String(active));
    tab.tabIndex = active ? 0 : -1; // roving tabindex: Tab enters the tab list once, arrows move inside it
    if (active && focus) tab.focus();
    document.getElementById(tab.getAttribute("aria-controls")).hidden = !active;
  }
  if (history.replaceState) history.replaceState(null, "", `#${name}`);
  if (info && !mounted.has(name)) {
    mounted.add(name);
    VIEWS[name].mount(document.getElementById(`view-${name}`), info);
  }
}

function onTabKey(event) {
  const list = tabs();
  const index = list.indexOf(event.currentTarget);
  const moves = { ArrowRight: index + 1, ArrowLeft: index - 1, Home: 0, End: list.length - 1 };
  if (!(event.key in moves)) return;
  event.preventDefault();
  const next = list[(moves[event.key] + list.length) % list.length];
  open(next.dataset.view, { focus: true });
}

function describe(model) {
  const c = model.config;
  return `${model.name} · ${model.model_type} · ${c.num_hidden_layers} layers, hidden ${c.hidden_size}, ` +
    `${c.num_attention_heads} heads, vocabulary ${fmtInt(c.vocab_size)} · ${fmtInt(model.total_parameters)} ` +
    `parameters (embeddings ${fmtShare(model.embedding_share)}) · ${model.has_mlm ? "masked-LM head" : "no masked-LM head"}`;
}

async function start() {
  for (const tab of tabs()) {
    tab.addEventListener("click", () => open(tab.dataset.view));
    tab.addEventListener("keydown", onTabKey);
  }
  const first = location.hash.slice(1);
  open(first); // show the tab strip at once; the view itself waits for /api/info
  try {
    info = await getJSON("/api/info");
  } catch (error) {
    say(`Could not read the model's description: ${error.message}`, "error");
    return;
  }
  document.documentElement.lang = info.model.language;
  document.getElementById("model-line").textContent = describe(info.model);
  document.body.dataset.ready = "true";
  open(location.hash.slice(1) || first);
}

start();
