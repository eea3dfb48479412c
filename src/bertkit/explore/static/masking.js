// View 3, masking step by step, with the library's own masking code on the server: which tokens are
// picked (15% of the candidates), what becomes of them (80% [MASK], 10% random, 10% unchanged), the input
// the model sees, the labels (-100 = no loss), and the model's top-5, p(true token) and loss at each pick.
// The seed makes a draw reproducible; "reseed" draws again. Whole-word masking picks all pieces of a word.

import { run } from "./api.js";
import { el, field, fmtNum, fmtProb } from "./charts.js";

const KIND_CLASS = { "[MASK]": "k-mask", random: "k-random", unchanged: "k-unchanged", "": "" };

export function mount(root, info) {
  const text = field("Text", { id: "mask-text", value: info.examples.text, multiline: true });
  const seed = field("Seed", { id: "mask-seed", value: "0", type: "number", attrs: { min: 0, step: 1 } });
  const whole = el("input", { id: "mask-whole-word", type: "checkbox", "data-testid": "masking-whole-word" });
  const reseed = el("button", { type: "button", "data-testid": "masking-reseed" }, "Reseed (seed + 1)");
  const form = el("form", { class: "controls" }, text.wrap, seed.wrap,
    el("div", { class: "field check" }, whole, el("label", { for: "mask-whole-word" }, "Whole-word masking")),
    el("button", { type: "submit" }, "Mask"), reseed);
  const out = el("div", { class: "output", "data-testid": "masking-output" });
  root.append(form, out);

  const load = () => run(root, async (post) => {
    const data = await post("/api/masking", { text: text.input.value, seed: Number(seed.input.value) || 0,
                                                  whole_word: whole.checked });
    render(out, data, info);
  });
  form.addEventListener("submit", (event) => { event.preventDefault(); load(); });
  whole.addEventListener("change", load);
  reseed.addEventListener("click", () => { seed.input.value = String((Number(seed.input.value) || 0) + 1); load(); });
  load();
}

// One row of tokens; cls(i) and sub(i) add a class and a small line under each token.
function tokenRow(tokens, { cls = () => "", sub = null, testid = null, attrs = () => ({}) } = {}) {
  return el("div", { class: "tokens static" }, tokens.map((t, i) => el("span", {
    class: `token ${cls(i)}`, "data-testid": testid, "data-position": i, ...attrs(i) },
    el("span", { class: "token-text" }, t), el("span", { class: "token-index" }, sub ? sub(i) : String(i)))));
}

function step(n, title, ...body) {
  return el("li", { class: "step" }, el("h3", {}, `${n}. ${title}`), ...body);
}

function predictionRow(p, hasMlm) {
  const top = hasMlm
    ? el("ol", { class: "top" }, p.top.map((c) => el("li", {
        class: c.token === p.original ? "true-token" : "", "data-testid": "masking-top",
        "data-token": c.token, "data-score": String(c.score) },
        el("span", { class: "cand" }, c.token), " ", el("span", { class: "num" }, fmtProb(c.score)))))
    : el("span", {}, "—");
  return el("tr", { "data-testid": "masking-prediction", "data-position": p.position, "data-kind": p.kind,
                    "data-prob-true": p.prob_true === null ? "" : String(p.prob_true),
                    "data-loss": p.loss === null ? "" : String(p.loss) },
    el("td", { class: "num" }, String(p.position)), el("td", {}, p.original), el("td", {}, p.shown),
    el("td", {}, el("span", { class: `kind ${KIND_CLASS[p.kind] || ""}` }, p.kind)), el("td", {}, top),
    el("td", { class: "num", "data-testid": "masking-prob-true" }, fmtProb(p.prob_true)),
    el("td", { class: "num" }, fmtNum(p.loss, 4)));
}

function render(out, data, info) {
  const c = data.counts;
  const picked = (i) => data.kinds[i] !== "";
  const grouped = data.word_starts.some((start, i) => !start && !data.special[i]);
  const steps = el("ol", { class: "steps" },
    step(1, "Pick 15% of the candidates",
      el("p", { class: "caption" }, `${c.candidates} candidate tokens ([CLS]/[SEP] never are); `,
        el("b", { "data-testid": "masking-count-selected" }, String(c.selected)), " picked.",
        // Chinese text comes with jieba's words; under whole-word masking a word's pieces touch.
        data.words ? ` jieba's words are shown below the tokens${grouped ? "; pieces of one word touch" : ""}.` : ""),
      tokenRow(data.tokens, {
        testid: "masking-token",
        cls: (i) => [picked(i) ? "selected" : "", data.special[i] ? "special" : "",
                     data.word_starts[i] ? "" : "continues"].join(" "),
        attrs: (i) => ({ "data-selected": String(picked(i)) }) }),
      data.words ? el("div", { class: "words", "data-testid": "masking-words" },
        el("span", { class: "caption" }, "jieba words: "), data.words.map((w) => el("span", { class: "word" }, w))) : null),
    step(2, "80% [MASK], 10% random, 10% unchanged",
      el("p", { class: "caption" }, `${c.masked} → [MASK], ${c.random} → a random token, ${c.unchanged} left as they are.`),
      tokenRow(data.tokens, { cls: (i) => KIND_CLASS[data.kinds[i]], sub: (i) => data.kinds[i] || "·" })),
    step(3, "The input the model sees",
      tokenRow(data.input_tokens, { testid: "masking-input", cls: (i) => KIND_CLASS[data.kinds[i]] })),
    step(4, "Labels: the original id where picked, −100 (no loss) elsewhere",
      tokenRow(data.labels.map(String), { testid: "masking-label", cls: (i) => (data.labels[i] === -100 ? "ignored" : "selected") })),
    step(5, "The model's guesses at the picked positions",
      info.model.has_mlm
        ? el("p", { class: "caption" }, "Mean cross-entropy over the picked positions: ",
            el("b", { class: "num", "data-testid": "masking-loss", "data-loss": String(data.loss) }, fmtNum(data.loss, 4)))
        : el("p", { class: "notice", "data-testid": "no-mlm" },
            "This model has no masked-LM head, so there are no guesses, p(true) or loss to show; the steps above are the same."),
      el("div", { class: "scroll" }, el("table", { class: "predictions" },
        el("thead", {}, el("tr", {}, ["pos", "original", "shown", "kind", "top-5", "p(true)", "loss"].map((h) => el("th", {}, h)))),
        el("tbody", {}, data.predictions.map((p) => predictionRow(p, info.model.has_mlm)))))));
  out.replaceChildren(steps);
}
