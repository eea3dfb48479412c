// View 4, fill-mask: the masked-LM head's top-k for every [MASK], for two contexts side by side so the
// same slot can be seen to change with its neighbours (the fruit against the company).

import { ready, run } from "./api.js";
import { barRow, el, field, noMlmNotice } from "./charts.js";

export function mount(root, info) {
  if (!info.model.has_mlm) {
    root.append(noMlmNotice("fill-mask predictions"));
    ready(root);
    return;
  }
  const mask = info.model.special_tokens.mask;
  const [first, second] = info.examples.mask_pair;
  const a = field(`Context A (write ${mask} for the slot)`, { id: "fm-a", value: first, multiline: true });
  const b = field("Context B (optional, same slot in another context)", { id: "fm-b", value: second, multiline: true });
  const k = field("Top-k", { id: "fm-k", value: "5", type: "number", attrs: { min: 1, max: 50, step: 1 } });
  const form = el("form", { class: "controls" }, a.wrap, b.wrap, k.wrap, el("button", { type: "submit" }, "Fill"));
  const out = el("div", { class: "output side-by-side", "data-testid": "fillmask-output" });
  root.append(form, out);

  const load = () => run(root, async (post) => {
    const texts = [a.input.value, b.input.value].filter((t) => t.trim() !== "");
    const data = await post("/api/fill-mask", { texts, top_k: Number(k.input.value) || 5 });
    out.replaceChildren(...data.results.map((masks, i) => column(texts[i], masks, i)));
  });
  form.addEventListener("submit", (event) => { event.preventDefault(); load(); });
  load();
}

function column(text, masks, index) {
  return el("div", { class: "panel", "data-testid": "fillmask-result", "data-index": index },
    el("h3", {}, `Context ${"AB"[index] || index + 1}`),
    el("p", { class: "quote" }, text),
    masks.map((candidates, m) => el("div", { class: "bars", "data-testid": "fillmask-slot", "data-slot": m },
      masks.length > 1 ? el("h4", {}, `[MASK] #${m + 1}`) : null,
      candidates.map((c) => barRow(c.token, c.score, {
        max: candidates[0].score, valueTestid: "fillmask-score",
        attrs: { "data-testid": "fillmask-row", "data-token": c.token, "data-token-id": c.token_id,
                 "data-score": String(c.score) } })))));
}
