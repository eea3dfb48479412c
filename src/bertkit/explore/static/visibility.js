// View 1, who sees whom: BERT's bidirectional mask against GPT's causal one for a chosen position, and
// the three training objectives side by side. Full visibility with a next-token target is marked as a
// leak: the answer sits in the input, so the model can copy it instead of learning anything.

import { optional, run } from "./api.js";
import { el, field, fitCell, fmtProb, heatmap, tokenButtons } from "./charts.js";

export function mount(root, info) {
  const text = field("Text", { id: "vis-text", value: info.examples.text });
  const pair = field("Second sentence (optional)", { id: "vis-pair", value: "" });
  const form = el("form", { class: "controls" }, text.wrap, pair.wrap,
    el("button", { type: "submit" }, "Show"));
  const out = el("div", { class: "output", "data-testid": "visibility-output" });
  root.append(form, out);

  let position = 1; // the first real token: [CLS] at 0 is less telling
  const load = () => run(root, async (post) => {
    const data = await post("/api/visibility", { text: text.input.value, pair: optional(pair.input.value), position });
    position = data.position;
    render(out, data, info, (p) => { position = p; load(); });
  });
  // A new text may be shorter than the chosen position: start again at its first real token.
  form.addEventListener("submit", (event) => { event.preventDefault(); position = 1; load(); });
  load();
}

function maskPanel(title, key, matrix, data, pick) {
  const p = data.position;
  const seen = matrix[p].reduce((a, b) => a + b, 0);
  return el("div", { class: "panel", "data-testid": `visibility-${key}` },
    el("h3", {}, title),
    el("p", { class: "caption" }, `Position ${p} (${data.tokens[p]}) sees `,
      el("b", { class: "num", "data-testid": `visibility-${key}-count` }, String(seen)), ` of ${data.tokens.length} tokens.`),
    tokenButtons(data.tokens, {
      selected: p, onPick: pick, testid: `visibility-${key}-token`,
      classFor: (j) => [j === p ? "selected" : "", matrix[p][j] ? "visible" : "hidden-token",
                        data.special[j] ? "special" : ""].join(" "),
      extra: (j) => ({ "data-visible": String(matrix[p][j]) }) }),
    heatmap(matrix, { rows: data.tokens, cols: data.tokens, cell: fitCell(data.tokens.length, 420, 6, 20), testid: `visibility-${key}-cell`,
      title: `${title}: row = query, column = key; dark = may attend`,
      color: (v) => (v ? "hsl(215, 70%, 45%)" : "hsl(215, 30%, 95%)"),
      rowClass: (r) => (r === p ? "hl" : ""), colClass: () => "" }),
    el("p", { class: "caption" }, "Row = the position that looks, column = the position looked at; the highlighted row is yours."));
}

// Why a probability is absent, in words, rather than a blank.
function missingProb(obj, info) {
  if (obj.target === null) return "no next token after the last position";
  if (!info.model.has_mlm) return "this model has no masked-LM head";
  return "BERT is not trained to predict through a causal mask";
}

function objectiveCard(obj, info) {
  const visible = new Set(obj.visible);
  const tokens = el("div", { class: "tokens static" }, obj.input.map((token, i) => el("span", {
    class: ["token", visible.has(i) ? "visible" : "hidden-token", i === obj.predict_at ? "predict-at" : "",
            i === obj.target_position ? "target" : ""].join(" "), title: `position ${i}` },
    el("span", { class: "token-text" }, token), el("span", { class: "token-index" }, String(i)))));
  return el("div", { class: `objective panel${obj.leak ? " leak" : ""}`, "data-testid": "objective",
                     "data-leak": String(obj.leak), "data-prob": obj.prob === null ? "" : String(obj.prob) },
    el("h3", {}, obj.name, obj.leak ? el("span", { class: "badge leak-badge", "data-testid": "leak-badge" }, "LEAK") : null),
    el("p", { class: "caption" }, `${obj.mask} mask · predict at ${obj.predict_at} → target `,
      el("b", {}, obj.target === null ? "none (end of input)" : `${obj.target} (position ${obj.target_position})`)),
    tokens,
    el("p", {}, "Model's p(target): ",
      el("b", { class: "num", "data-testid": "objective-prob", title: obj.prob === null ? null : String(obj.prob) },
        fmtProb(obj.prob)),
      obj.prob === null ? el("span", { class: "caption" }, ` (${missingProb(obj, info)})`) : null),
    el("p", { class: "note" }, obj.note));
}

function render(out, data, info, pick) {
  out.replaceChildren(
    el("div", { class: "side-by-side" },
      maskPanel("BERT: bidirectional", "bert", data.bert, data, pick),
      maskPanel("GPT: causal", "gpt", data.gpt, data, pick)),
    el("h3", {}, "Three objectives for the same position"),
    el("p", { class: "caption legend" },
      el("span", { class: "token predict-at" }, "predicted here"), " ",
      el("span", { class: "token target" }, "target"), " ",
      el("span", { class: "token visible" }, "visible"), " ",
      el("span", { class: "token hidden-token" }, "hidden")),
    el("div", { class: "side-by-side three" }, data.objectives.map((o) => objectiveCard(o, info))));
}
