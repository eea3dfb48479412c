// View 5, attention: a layer × head grid of small heatmaps (as bertviz's model view), one head token to
// token (as its head view: lines from each query on the left to the keys on the right, and the matrix
// with its numbers), and the padding panel: one head's real scores, softmaxed with the padding keys
// hidden (what BERT does) and without (what would happen if the mask were forgotten).

import { optional, ready, run } from "./api.js";
import { diverging, el, field, fitCell, fmtProb, heat, heatCanvas, heatmap, maxOf, svgEl } from "./charts.js";

const ROW = 22; // px per token in the line view

export function mount(root, info) {
  const text = field("Text", { id: "att-text", value: info.examples.text });
  const pair = field("Second sentence (optional)", { id: "att-pair", value: "" });
  const pad = field("Padding tokens for the padding panel", { id: "att-pad", value: "4", type: "number",
                                                              attrs: { min: 1, max: 32, step: 1 } });
  const hide = el("input", { id: "att-hide", type: "checkbox", "data-testid": "attention-hide-special" });
  const form = el("form", { class: "controls" }, text.wrap, pair.wrap, pad.wrap,
    el("div", { class: "field check" }, hide, el("label", { for: "att-hide" }, "Hide [CLS]/[SEP]")),
    el("button", { type: "submit" }, "Show"));
  const out = el("div", { class: "output", "data-testid": "attention-output" });
  root.append(form, out);

  const state = { layer: 0, head: 0, data: null, query: null };
  const load = () => run(root, async (post) => {
    state.data = await post("/api/attention", { text: text.input.value, pair: optional(pair.input.value),
      pad: Number(pad.input.value) || 4, layer: state.layer, head: state.head });
    draw();
  });
  const draw = () => render(out, state, hide.checked, (layer, head) => {
    Object.assign(state, { layer, head, query: null });
    load(); // the padding panel is computed by the server for the chosen head
  }, (query) => { state.query = state.query === query ? null : query; draw(); });
  form.addEventListener("submit", (event) => { event.preventDefault(); load(); });
  // Hiding is drawn from the numbers at hand; not a run, so an answer in flight is not dropped.
  hide.addEventListener("change", () => { if (state.data) { draw(); ready(root); } });
  load();
}

/** The token indices to show: all, or all but [CLS]/[SEP] (every one, if nothing else is left). */
function shownOf(data, hideSpecial) {
  const keep = data.tokens.map((_, i) => i).filter((i) => !(hideSpecial && data.special[i]));
  return keep.length ? keep : data.tokens.map((_, i) => i);
}

function subMatrix(matrix, keep) {
  return keep.map((r) => keep.map((c) => matrix[r][c]));
}

// Shade by the square root of the weight: a head spread over 30 tokens gives each about 0.03, which a
// linear scale would draw as white. With [CLS]/[SEP] hidden, rescale to the largest weight left: the
// specials often hold most of the mass, and the rest would be near white too.
function shadeOf(matrix, rescale) {
  const top = rescale ? Math.max(1e-12, maxOf(matrix.flat())) : 1;
  return (v) => Math.sqrt(v / top);
}

function scaleFor(matrix, rescale) {
  const shade = shadeOf(matrix, rescale);
  return (v) => heat(shade(v));
}

function grid(data, keep, hideSpecial, state, pick) {
  const rows = data.attention.map((heads, layer) => el("tr", {}, el("th", { scope: "row" }, `layer ${layer}`),
    heads.map((matrix, head) => {
      const sub = subMatrix(matrix, keep);
      const active = layer === state.layer && head === state.head;
      return el("td", {}, el("button", {
        type: "button", class: `thumb-button${active ? " selected" : ""}`, "aria-pressed": String(active),
        "aria-label": `layer ${layer}, head ${head}`, "data-testid": "attention-thumb", "data-layer": layer, "data-head": head,
        onclick: () => pick(layer, head) }, heatCanvas(sub, { size: 56, color: scaleFor(sub, hideSpecial) })));
    })));
  return el("div", { class: "scroll" }, el("table", { class: "grid" },
    el("thead", {}, el("tr", {}, el("th", {}), Array.from({ length: data.heads }, (_, h) => el("th", {}, `head ${h}`)))),
    el("tbody", {}, rows)));
}

function lineView(data, keep, matrix, state, pickQuery, rescale) {
  const height = keep.length * ROW;
  const width = 160;
  // Line opacity = the weight itself, as bertviz draws it (rescaled only when specials are hidden).
  const scale = rescale ? Math.max(1e-12, maxOf(subMatrix(matrix, keep).flat())) : 1;
  const svg = svgEl("svg", { class: "lines", width, height, "aria-hidden": "true" });
  keep.forEach((q, a) => keep.forEach((k, b) => {
    if (state.query !== null && state.query !== q) return;
    const w = matrix[q][k] / scale;
    if (w < 0.02) return; // faint lines only clutter the picture
    svg.append(svgEl("line", { x1: 0, y1: a * ROW + ROW / 2, x2: width, y2: b * ROW + ROW / 2,
      "stroke-opacity": w.toFixed(3), "stroke-width": (0.5 + 3 * w).toFixed(2), class: "att-line" }));
  }));
  const column = (side) => el("div", { class: `line-tokens ${side}` }, keep.map((i) => side === "left"
    ? el("button", { type: "button", class: `token line-token${state.query === i ? " selected" : ""}`,
        "aria-pressed": String(state.query === i), "data-testid": "attention-query", "data-position": i,
        title: "show only this token's attention", onclick: () => pickQuery(i) }, data.tokens[i])
    : el("span", { class: `line-token${state.query !== null && matrix[state.query][i] / scale > 0.5 ? " strong" : ""}` },
        data.tokens[i])));
  return el("div", { class: "line-view" }, column("left"), svg, column("right"));
}

function paddingPanel(padding) {
  const { tokens, real } = padding;
  const rows = tokens.slice(0, real);
  const isPad = (c) => (c >= real ? "pad-col" : "");
  const padMass = (m) => m.map((row) => row.slice(real).reduce((a, b) => a + b, 0));
  const meanOf = (xs) => xs.reduce((a, b) => a + b, 0) / Math.max(1, xs.length);
  const absMax = Math.max(1e-12, maxOf(padding.scores.flat().map(Math.abs)));
  const map = (matrix, testid, title, color) => el("figure", { class: "panel" }, el("figcaption", {}, title),
    heatmap(matrix, { rows, cols: tokens, cell: fitCell(tokens.length, 300, 5, 18), testid, title, color, colClass: isPad }));
  const without = meanOf(padMass(padding.without_mask));
  const withMask = meanOf(padMass(padding.with_mask));
  return el("div", { class: "panel", "data-testid": "attention-padding" },
    el("h3", {}, `The padding mask: layer ${padding.layer}, head ${padding.head}, ${tokens.length - real} × [PAD] appended`),
    el("p", { class: "caption" }, "The same scores q·k/√d, softmaxed two ways. Mean weight a real token gives to the [PAD] keys: ",
      el("b", { class: "num", "data-testid": "padding-mass-without", "data-value": String(without) }, fmtProb(without)),
      " without the mask, ",
      el("b", { class: "num", "data-testid": "padding-mass-with", "data-value": String(withMask) }, fmtProb(withMask)),
      " with it."),
    el("div", { class: "side-by-side three" },
      map(padding.scores, "padding-score-cell", "scores (before softmax)", (v) => diverging(v / absMax)),
      map(padding.without_mask, "padding-without-cell", "softmax without the mask", scaleFor(padding.without_mask, false)),
      map(padding.with_mask, "padding-with-cell", "softmax with the mask", scaleFor(padding.with_mask, false))));
}

function render(out, state, hideSpecial, pickHead, pickQuery) {
  const { data, layer, head } = state;
  const keep = shownOf(data, hideSpecial);
  const matrix = data.attention[layer][head];
  const sub = subMatrix(matrix, keep);
  const shade = shadeOf(sub, hideSpecial); // once: it scans the matrix for its maximum
  const refocus = document.activeElement && document.activeElement.dataset.testid; // keep keyboard users in place
  out.replaceChildren(
    el("h3", {}, `${data.layers} layers × ${data.heads} heads`),
    el("p", { class: "caption" }, "Each square: rows = the token that looks, columns = the tokens it looks at; darker = more weight (shade ∝ √weight).",
      hideSpecial ? " [CLS]/[SEP] hidden; colours rescaled to the largest weight left (weights are not renormalised)." : ""),
    grid(data, keep, hideSpecial, state, pickHead),
    el("div", { class: "panel", "data-testid": "attention-head", "data-layer": layer, "data-head": head },
      el("h3", {}, `Layer ${layer}, head ${head}`),
      el("p", { class: "caption" }, "Pick a token on the left to see only where it looks."),
      el("div", { class: "side-by-side" },
        lineView(data, keep, matrix, state, pickQuery, hideSpecial),
        heatmap(sub, { rows: keep.map((i) => data.tokens[i]), cols: keep.map((i) => data.tokens[i]), cell: fitCell(keep.length, 560),
          rowIds: keep, colIds: keep, testid: "attention-cell", color: scaleFor(sub, hideSpecial),
          dark: (v) => shade(v) > 0.6,
          title: `layer ${layer} head ${head} attention weights`, text: keep.length <= 20 ? (v) => v.toFixed(2).replace(/^0/, "") : null,
          rowClass: (r) => (keep[r] === state.query ? "hl" : "") }))),
    paddingPanel(data.padding));
  if (refocus === "attention-thumb") {
    out.querySelector(`[data-testid="attention-thumb"][data-layer="${layer}"][data-head="${head}"]`)?.focus();
  } else if (refocus === "attention-query" && state.query !== null) {
    out.querySelector(`[data-testid="attention-query"][data-position="${state.query}"]`)?.focus();
  }
}
