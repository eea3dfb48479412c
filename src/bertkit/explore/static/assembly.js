// View 2, input assembly: the WordPiece tokens with their segment and position ids, and for a chosen token
// the three table rows the model adds up (token + position + segment), the sum and the LayerNorm output.
// Below, the model's parameter table, to show how much of a small BERT is its embedding tables.

import { optional, run } from "./api.js";
import { el, field, fmtInt, fmtNum, fmtShare, robustScale, tokenButtons, vectorStrip } from "./charts.js";

const LEADING = 8; // dims printed as numbers; the strip chart shows the rest
const KINDS = [["token", "token embedding"], ["position", "position embedding"], ["segment", "segment embedding"],
               ["sum", "sum"], ["layernorm", "after LayerNorm"]];

export function mount(root, info) {
  const text = field("Text", { id: "asm-text", value: info.examples.text });
  const pair = field("Second sentence (optional)", { id: "asm-pair", value: info.examples.pair });
  const form = el("form", { class: "controls" }, text.wrap, pair.wrap, el("button", { type: "submit" }, "Show"));
  const out = el("div", { class: "output", "data-testid": "assembly-output" });
  root.append(form, out, parameterTable(info.model));

  let position = 1;
  const load = () => run(root, async (post) => {
    const data = await post("/api/assembly", { text: text.input.value, pair: optional(pair.input.value), position });
    position = data.position;
    render(out, data, (p) => { position = p; load(); });
  });
  // A new text may be shorter than the chosen position: start again at its first real token.
  form.addEventListener("submit", (event) => { event.preventDefault(); position = 1; load(); });
  load();
}

function idsTable(data, pick) {
  const row = (name, values, testid) => el("tr", {}, el("th", { scope: "row" }, name),
    values.map((v, i) => el("td", { class: `num${i === data.position ? " hl" : ""}`, "data-testid": testid }, String(v))));
  return el("div", { class: "scroll" }, el("table", { class: "ids" },
    el("tbody", {},
      el("tr", {}, el("th", { scope: "row" }, "token"), data.tokens.map((t, i) => el("td", { class: i === data.position ? "hl" : "" },
        tokenButtons([t], { selected: i === data.position ? 0 : -1, onPick: () => pick(i), testid: "assembly-token", showIndex: false,
          classFor: () => (i === data.position ? "selected" : ""), extra: () => ({ "data-position": i }) })))),
      row("id", data.ids, "assembly-id"),
      row("segment", data.segments, "assembly-segment"),
      row("position", data.positions, "assembly-position"))));
}

function vectorTable(data) {
  const dims = Math.min(LEADING, data.dims);
  const head = el("tr", {}, el("th", {}, "vector"), Array.from({ length: dims }, (_, d) => el("th", { class: "num" }, `d${d}`)),
    el("th", { class: "num" }, "…"), el("th", { class: "num" }, "L2 norm"));
  const rows = KINDS.map(([key, name]) => {
    const v = data.vectors[key];
    if (v === null) {
      return el("tr", { "data-testid": "assembly-vector", "data-kind": key },
        el("th", { scope: "row" }, name), el("td", { colspan: dims + 2 }, "this model has no segment table"));
    }
    return el("tr", { "data-testid": "assembly-vector", "data-kind": key, "data-norm": String(data.norms[key]) },
      el("th", { scope: "row" }, name),
      v.slice(0, dims).map((x) => el("td", { class: "num", "data-testid": "assembly-dim", "data-value": String(x) }, fmtNum(x))),
      el("td", { class: "num" }, data.dims > dims ? `+${data.dims - dims}` : ""),
      el("td", { class: "num", "data-testid": "assembly-norm" }, fmtNum(data.norms[key])));
  });
  return el("table", { class: "vectors" }, el("thead", {}, head), el("tbody", {}, rows));
}

function strips(data) {
  // Each strip on its own scale (printed): the three rows differ in size by up to 10x, and one shared
  // scale would draw the smaller ones flat. The table above compares the actual numbers.
  return el("div", { class: "strips" }, KINDS.filter(([k]) => data.vectors[k]).map(([key, name]) => {
    const scale = robustScale(data.vectors[key]);
    return el("figure", { class: "strip-figure" },
      el("figcaption", {}, `${name}, all ${data.dims} dims (full bar = ±${fmtNum(scale)}; larger values clipped, darker)`),
      vectorStrip(data.vectors[key], { scale, barWidth: Math.max(1, Math.min(14, Math.floor(768 / data.dims))),
                                       title: `${name}, ${data.dims} dimensions` }));
  }));
}

function render(out, data, pick) {
  const p = data.position;
  out.replaceChildren(
    idsTable(data, pick),
    el("h3", {}, `Position ${p}: `, el("span", { class: "token-inline" }, data.tokens[p]),
      ` (id ${data.ids[p]}, segment ${data.segments[p]}, position row ${data.positions[p]})`),
    el("p", { class: "caption" }, "sum = token + position + segment, element by element; LayerNorm then rescales it to mean 0, variance 1 and applies its learned gain and bias."),
    el("div", { class: "scroll" }, vectorTable(data)),
    strips(data));
}

function parameterTable(model) {
  const isEmbedding = (name) => name.startsWith("embeddings."); // as /api/info counts embedding_share
  return el("div", { class: "panel", "data-testid": "assembly-parameters" },
    el("h3", {}, "Parameters of this model"),
    el("p", { class: "caption" }, `${fmtInt(model.total_parameters)} in all; the embedding tables hold `,
      el("b", { "data-testid": "embedding-share" }, fmtShare(model.embedding_share)), "."),
    el("div", { class: "scroll" }, el("table", { class: "params" },
      el("thead", {}, el("tr", {}, el("th", {}, "part"), el("th", { class: "num" }, "parameters"), el("th", { class: "num" }, "share"))),
      el("tbody", {}, model.parameters.map((row) => el("tr", { class: isEmbedding(row.name) ? "hl" : "", "data-testid": "parameter-row" },
        el("td", {}, row.name), el("td", { class: "num" }, fmtInt(row.count)), el("td", { class: "num" }, fmtShare(row.share))))))));
}
