// Talking to the explore server: JSON in, JSON out, and the server's own error message shown to the user.
//
// Every view calls `run(root, work)`: it marks the view busy, runs the request, and on failure puts the
// server's `error` text (which names the problem and the fix) in the page's one status area. The view root
// carries data-state ("loading" | "ready" | "error"), data-done (a count of finished runs) and data-ms (the
// last run's time) so a test, or a curious user, can tell when the numbers on screen are current.

const statusBox = () => document.getElementById("status");

/** Show a message in the status area; kind "error" makes it stand out. */
export function say(message, kind = "info") {
  const box = statusBox();
  box.textContent = message;
  box.dataset.kind = kind;
}

export function clearStatus() {
  say("", "info");
}

async function parse(response, path) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // A proxy or a crash may answer with HTML; say which route failed rather than "bad JSON".
    throw new Error(`${path} answered HTTP ${response.status} without JSON`);
  }
  if (!response.ok) {
    throw new Error(body && body.error ? body.error : `${path} answered HTTP ${response.status}`);
  }
  return body;
}

export async function getJSON(path) {
  return parse(await fetch(path, { headers: { Accept: "application/json" } }), path);
}

export async function postJSON(path, payload) {
  const response = await fetch(path, {
    method: "POST",
    headers: { "Content-Type": "application/json", Accept: "application/json" },
    body: JSON.stringify(payload),
  });
  return parse(response, path);
}

const STALE = Symbol("stale"); // thrown when a newer run of the same view started meanwhile
const tickets = new WeakMap();

/**
 * Run one interaction of a view: `work(post)` fetches with `post(path, payload)` and renders; errors
 * go to the status area. When the user clicks again before an answer arrives, the older answer is
 * dropped (its `post` throws STALE) so a slow reply can never overwrite a newer one.
 */
export async function run(root, work) {
  const ticket = (tickets.get(root) || 0) + 1;
  tickets.set(root, ticket);
  const post = async (path, payload) => {
    const data = await postJSON(path, payload);
    if (tickets.get(root) !== ticket) throw STALE;
    return data;
  };
  const started = performance.now();
  root.dataset.state = "loading";
  root.setAttribute("aria-busy", "true");
  try {
    await work(post);
    root.dataset.state = "ready";
    clearStatus();
  } catch (error) {
    if (error === STALE) return;
    root.dataset.state = "error";
    say(error.message, "error");
  }
  root.removeAttribute("aria-busy");
  root.dataset.ms = String(Math.round(performance.now() - started));
  root.dataset.done = String(Number(root.dataset.done || 0) + 1);
}

/** A view with nothing to fetch (no MLM head, no task models) is ready as soon as it is drawn. */
export function ready(root) {
  root.dataset.state = "ready";
  root.dataset.done = String(Number(root.dataset.done || 0) + 1);
}

/** The optional second segment: an empty box means a single sentence (null in the API). */
export function optional(text) {
  const trimmed = text.trim();
  return trimmed === "" ? null : trimmed;
}
