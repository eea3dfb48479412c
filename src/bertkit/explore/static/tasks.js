// View 6, tasks: one card per fine-tuned model the page was started with (/api/info's tasks), each with
// its own input and its answer drawn the way people read it: bars for classes, spans marked in the text
// for NER and QA, a matrix for embedding similarity, a ranked list for reranking.

import { ready, run } from "./api.js";
import { barRow, el, field, fmtNum, fmtProb, heat, heatmap } from "./charts.js";

export function mount(root, info) {
  if (!info.tasks.length) {
    root.append(el("p", { class: "notice", "data-testid": "no-tasks" },
      "No fine-tuned models were given. Start the page with e.g. bertkit explore --model sentiment=runs/clf/model " +
      "(a classifier, token tagger, QA model, sentence embedder or cross-encoder) to try them here."));
    ready(root);
    return;
  }
  // One request per card, one after another: on two cores parallel requests only queue on the server.
  const cards = info.tasks.map((task) => card(task, info.examples));
  root.append(el("div", { class: "cards" }, cards.map((c) => c.node)));
  run(root, async (post) => { for (const c of cards) await c.load(post); });
}

// Python counts characters in code points, JavaScript strings in UTF-16 units: slice code points.
function marked(text, spans, { testid, label }) {
  const chars = Array.from(text);
  const nodes = [];
  let at = 0;
  for (const span of [...spans].sort((a, b) => a.start - b.start)) {
    if (span.start < at) continue; // overlapping spans: keep the first
    nodes.push(chars.slice(at, span.start).join(""));
    nodes.push(el("mark", { "data-testid": testid, "data-start": span.start, "data-end": span.end,
                            "data-score": String(span.score), "data-type": span.type || null,
                            title: `${label(span)} · score ${fmtProb(span.score)}` },
      chars.slice(span.start, span.end).join(""), el("sup", {}, label(span))));
    at = span.end;
  }
  nodes.push(chars.slice(at).join(""));
  return el("p", { class: "quote marked" }, nodes);
}

// A classifier's bars, best first; a regression head (label null) answers one value instead.
function classified(r) {
  if (r.label === null && "value" in r) {
    return el("p", {}, "Predicted value: ",
      el("b", { class: "num", "data-testid": "task-value", "data-value": String(r.value) }, fmtNum(r.value, 4)));
  }
  const ranked = Object.entries(r.scores).sort((a, b) => b[1] - a[1]);
  return el("div", { class: "bars" },
    el("p", {}, "Predicted: ", el("b", { "data-testid": "task-label" }, r.label)),
    ranked.map(([label, p]) => barRow(label, p, { valueTestid: "task-classify-prob",
      attrs: { "data-testid": "task-classify-row", "data-label": label, "data-prob": String(p) } })));
}

const lines = (value) => value.split("\n").map((l) => l.trim()).filter(Boolean);

const USES = {
  classify: (ex) => ({ inputs: [field("Text", { value: ex.classify }), field("Second text (optional)", { value: "" })],
    payload: ([t, p]) => ({ text: t, pair: p.trim() === "" ? null : p }),
    draw: classified }),
  ner: (ex) => ({ inputs: [field("Text", { value: ex.ner, multiline: true })],
    payload: ([t]) => ({ text: t }),
    draw: (r) => el("div", {}, r.entities.length ? marked(r.text, r.entities, { testid: "task-ner-entity", label: (s) => s.type })
      : el("p", { class: "caption", "data-testid": "task-ner-none" }, "No entities found in: ", el("q", {}, r.text))) }),
  qa: (ex) => ({ inputs: [field("Question", { value: ex.question }), field("Context", { value: ex.context, multiline: true })],
    payload: ([q, c]) => ({ question: q, context: c }),
    draw: (r) => el("div", {}, r.answers.length
      ? [marked(r.context, r.answers.slice(0, 1), { testid: "task-qa-answer", label: () => "answer" }),
         el("ol", { class: "answers" }, r.answers.map((a) => el("li", { "data-testid": "task-qa-candidate", "data-score": String(a.score) },
           el("q", {}, a.text), " ", el("span", { class: "num" }, fmtProb(a.score)))))]
      : el("p", { class: "caption" }, "No answer span found in the context.")) }),
  embed: (ex) => ({ inputs: [field("Sentences, one per line", { value: ex.similar.join("\n"), multiline: true })],
    payload: ([t]) => ({ texts: lines(t) }),
    draw: (r) => el("div", { class: "scroll" },
      heatmap(r.similarity, { rows: r.texts.map((_, i) => `#${i}`), cols: r.texts.map((_, i) => `#${i}`), cell: 44,
        testid: "task-embed-cell", title: "cosine similarity", color: (v) => heat(Math.max(0, v)), text: (v) => v.toFixed(2) }),
      el("ol", { class: "legend-list", start: 0 }, r.texts.map((t) => el("li", {}, t)))) }),
  rerank: (ex) => ({ inputs: [field("Query", { value: ex.query }), field("Documents, one per line", { value: ex.documents.join("\n"), multiline: true })],
    payload: ([q, d]) => ({ query: q, texts: lines(d) }),
    draw: (r) => el("ol", { class: "ranked" }, r.ranked.map((d) => el("li", {
      "data-testid": "task-rerank-row", "data-index": d.index, "data-score": String(d.score) },
      el("span", { class: "num" }, fmtProb(d.score)), " ", d.text, el("span", { class: "caption" }, ` (was #${d.index})`)))) }),
};

let fieldCount = 0; // unique ids so every <label for> finds its input

function card(task, examples) {
  const spec = USES[task.use](examples);
  for (const f of spec.inputs) {
    const id = `task-field-${fieldCount++}`;
    f.input.id = id;
    f.wrap.querySelector("label").htmlFor = id;
  }
  const out = el("div", { class: "output", "data-testid": "task-output" });
  const form = el("form", { class: "controls" }, spec.inputs.map((f) => f.wrap), el("button", { type: "submit" }, "Run"));
  const node = el("div", { class: "panel task", "data-testid": `task-${task.name}`, "data-use": task.use },
    el("h3", {}, task.name, " ", el("span", { class: "badge" }, task.use)),
    task.labels.length ? el("p", { class: "caption" }, `labels: ${task.labels.join(", ")}`) : null,
    form, out);
  const load = async (post) => {
    const values = spec.inputs.map((f) => f.input.value);
    const result = await post("/api/task", { model: task.name, ...spec.payload(values) });
    out.replaceChildren(spec.draw(result));
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    run(node, load);
  });
  return { node, load };
}
