// Small DOM and SVG helpers shared by the views: element builders, number formats, a heatmap, bars and a
// vector strip. Plain SVG so the page needs no library and prints and scales cleanly.

const SVG_NS = "http://www.w3.org/2000/svg";

/** Build an HTML element: attrs go to attributes (dataset via "data-*"), children may be strings or nodes. */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  node.append(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return node;
}

export function svgEl(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  node.append(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return node;
}

function setAttrs(node, attrs) {
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.setAttribute("class", value);
    else if (key.startsWith("on") && typeof value === "function") node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
}

// One format per kind of number, so the same quantity reads the same in every view.
export const fmtProb = (p) => (p === null || p === undefined ? "—" : Number(p).toFixed(4));
export const fmtNum = (x, digits = 3) => (x === null || x === undefined ? "—" : Number(x).toFixed(digits));
export const fmtInt = (n) => Number(n).toLocaleString("en-US");
export const fmtShare = (s) => `${(100 * s).toFixed(2)}%`;

/** The largest value; a loop, because Math.max(...xs) overflows the call stack on a 512 × 512 matrix. */
export function maxOf(values) {
  let top = -Infinity;
  for (const v of values) if (v > top) top = v;
  return top;
}

/** A cell size (px) that keeps a matrix of n rows or columns near `span` px, within [lo, hi]. */
export const fitCell = (n, span, lo = 6, hi = 24) => Math.max(lo, Math.min(hi, Math.floor(span / Math.max(1, n))));

/** A light-to-dark blue for a value in [0, 1]. */
export function heat(t) {
  const clamped = Math.max(0, Math.min(1, t));
  return `hsl(215, 85%, ${Math.round(97 - 62 * clamped)}%)`;
}

/** Blue below zero, red above, white at zero; t in [-1, 1]. */
export function diverging(t) {
  const clamped = Math.max(-1, Math.min(1, t));
  const hue = clamped < 0 ? 215 : 5;
  return `hsl(${hue}, 80%, ${Math.round(97 - 55 * Math.abs(clamped))}%)`;
}

// Room for the longest label at 11px: about 7 px per Latin character, 11 per CJK one.
const WIDE = /[\u1100-\u115f\u2e80-\ua4cf\uac00-\ud7a3\uf900-\ufaff\ufe30-\ufe4f\uff00-\uff60]/u;
const textWidth = (label) => [...label].reduce((w, ch) => w + (WIDE.test(ch) ? 11 : 7.5), 0);
const labelWidth = (labels) => (labels ? Math.min(110, 14 + maxOf([7.5, ...labels.map(textWidth)])) : 0);

/**
 * A matrix as an SVG heatmap: matrix[r][c] -> one <rect>, rows top to bottom, columns left to right.
 * Options: rows / cols (labels, or null to draw none), cell (px), color(value) -> fill, testid (put on
 * every cell, with data-row, data-col and data-value = the exact number), rowClass(r) / colClass(c) for
 * highlighting, title (accessible name), text(value) -> string to print inside each cell, rowIds / colIds
 * (the original indices of the rows and columns shown, when some were left out) for data-row / data-col,
 * dark(value) -> true where the fill is dark enough for white text.
 */
export function heatmap(matrix, options = {}) {
  const { rows = null, cols = null, cell = 22, color = heat, testid = null, title = "",
          rowClass = () => "", colClass = () => "", text = null, rowIds = null, colIds = null,
          dark = (v) => v > 0.6 } = options;
  const nRows = matrix.length;
  const nCols = nRows ? matrix[0].length : 0;
  const left = labelWidth(rows);
  const top = labelWidth(cols);
  const labelStyle = `font-size:${Math.min(11, cell - 1)}px`; // small cells, small labels: no overlap
  const svg = svgEl("svg", { class: "heatmap", width: left + nCols * cell + 2, height: top + nRows * cell + 2,
                             role: "img", "aria-label": title });
  if (title) svg.append(svgEl("title", {}, title));
  rows?.forEach((label, r) => svg.append(svgEl("text", {
    x: left - 4, y: top + r * cell + cell / 2, class: `label row-label ${rowClass(r)}`, style: labelStyle,
    "text-anchor": "end", "dominant-baseline": "central" }, label)));
  cols?.forEach((label, c) => svg.append(svgEl("text", {
    x: 0, y: 0, class: `label col-label ${colClass(c)}`, style: labelStyle, "dominant-baseline": "central",
    transform: `translate(${left + c * cell + cell / 2}, ${top - 4}) rotate(-60)` }, label)));
  matrix.forEach((row, r) => row.forEach((value, c) => {
    const rect = svgEl("rect", {
      x: left + c * cell, y: top + r * cell, width: cell - 1, height: cell - 1, fill: color(value),
      class: `cell ${rowClass(r)} ${colClass(c)}`, "data-testid": testid, "data-row": rowIds ? rowIds[r] : r, "data-col": colIds ? colIds[c] : c,
      "data-value": String(value) });
    rect.append(svgEl("title", {}, `${rows ? rows[r] : r} → ${cols ? cols[c] : c}: ${value}`));
    svg.append(rect);
    if (text) svg.append(svgEl("text", { x: left + c * cell + cell / 2, y: top + r * cell + cell / 2,
      class: "cell-text", "text-anchor": "middle", "dominant-baseline": "central",
      fill: dark(value) ? "white" : "black" }, text(value)));
  }));
  return svg;
}

/** One labelled horizontal bar: label, a bar of width value/max, and the value as text. */
export function barRow(label, value, { max = 1, format = fmtProb, attrs = {}, valueTestid = null } = {}) {
  const width = max > 0 ? Math.max(0, Math.min(100, (100 * value) / max)) : 0;
  return el("div", { class: "bar-row", ...attrs },
    el("span", { class: "bar-label", lang: "" }, label),
    el("span", { class: "bar-track", "aria-hidden": "true" }, el("span", { class: "bar", style: `width:${width}%` })),
    el("span", { class: "bar-value num", "data-testid": valueTestid }, format(value)));
}

/**
 * The scale a strip of `values` is drawn at: the 98th percentile of |x|. BERT's embeddings have a few
 * outlier dimensions (MiniLM's token rows: one dim ~10× the rest), and scaling to the maximum would
 * draw every other dimension flat; the outliers are clipped instead.
 */
export function robustScale(values) {
  const sorted = values.map(Math.abs).sort((a, b) => a - b);
  return Math.max(1e-12, sorted[Math.min(sorted.length - 1, Math.floor(0.98 * sorted.length))] || 0);
}

/**
 * A vector as a strip of thin bars around a zero line, one bar per dimension (first `limit` dims).
 * scale: the absolute value that fills half the height (larger values are clipped, drawn darker).
 */
export function vectorStrip(values, { scale, height = 56, barWidth = 3, limit = 1024, title = "" } = {}) {
  const shown = values.slice(0, limit);
  const half = height / 2;
  const s = scale || robustScale(shown);
  const svg = svgEl("svg", { class: "strip", width: shown.length * barWidth, height, role: "img", "aria-label": title });
  svg.append(svgEl("line", { x1: 0, x2: shown.length * barWidth, y1: half, y2: half, class: "zero" }));
  shown.forEach((v, i) => {
    const h = Math.min(half, (half * Math.abs(v)) / s);
    svg.append(svgEl("rect", { x: i * barWidth, y: v >= 0 ? half - h : half, width: Math.max(1, barWidth - 1),
                               height: Math.max(0.5, h),
                               class: `${v >= 0 ? "pos" : "neg"}${Math.abs(v) > s ? " clipped" : ""}` }));
  });
  return svg;
}

/**
 * A row of token buttons (keyboard-usable): click/Enter picks a position. classFor(i) adds classes
 * (selected, visible, special...); the chosen position has aria-pressed="true".
 */
export function tokenButtons(tokens, { selected = null, onPick = null, classFor = () => "", testid = "token",
                                       extra = () => ({}), showIndex = true } = {}) {
  return el("div", { class: "tokens", role: "group", "aria-label": "tokens" },
    tokens.map((token, i) => el("button", {
      type: "button", class: `token ${classFor(i)}`, "data-testid": testid, "data-position": i,
      "aria-pressed": onPick ? String(i === selected) : null, title: `position ${i}`,
      onclick: onPick ? () => onPick(i) : null, ...extra(i) },
      el("span", { class: "token-text" }, token), showIndex ? el("span", { class: "token-index" }, String(i)) : null)));
}

/** A plain labelled text field; returns { wrap, input }. Every input gets a <label> for screen readers. */
export function field(labelText, { id, value = "", multiline = false, type = "text", attrs = {} } = {}) {
  const input = multiline
    ? el("textarea", { id, rows: 3, ...attrs })
    : el("input", { id, type, ...attrs });
  input.value = value;
  return { wrap: el("div", { class: "field" }, el("label", { for: id }, labelText), input), input };
}

/** A plain sentence for a view that needs the masked-LM head the model lacks. */
export function noMlmNotice(what) {
  return el("p", { class: "notice", "data-testid": "no-mlm" },
    `This model has no masked-LM head (its checkpoint carries no cls.predictions weights), so ${what} cannot be ` +
    "shown. Start bertkit explore with a pre-trained or quickstart model to see it.");
}

/**
 * A matrix as a small canvas, one pixel per cell scaled up by CSS: the attention grid draws
 * layers × heads of these, which would be tens of thousands of SVG nodes.
 */
export function heatCanvas(matrix, { size = 64, color = heat, label = "" } = {}) {
  const n = matrix.length;
  const m = n ? matrix[0].length : 0;
  const canvas = el("canvas", { width: m, height: n, class: "thumb", role: "img", "aria-label": label,
                                style: `width:${size}px;height:${Math.round((size * n) / Math.max(1, m))}px` });
  const ctx = canvas.getContext("2d");
  matrix.forEach((row, r) => row.forEach((value, c) => {
    ctx.fillStyle = color(value);
    ctx.fillRect(c, r, 1, 1);
  }));
  return canvas;
}
