// Oceanus status page: polls status.json every second and draws it. The server sends cumulative
// counters; rates, averages and the recent batch-size histogram are differences between polls
// kept here (the last minute), so the server keeps no history for the page.
"use strict";

(() => {
  const POLL_MS = 1000;
  const HISTORY_S = 60; // the sparkline's span
  const RATE_SPAN_S = 3; // headline rates: over the last few seconds
  const WINDOW_S = 10; // batch sizes and the split of request time: the last ten seconds
  const PARTS = [
    ["queue", "queue"],
    ["compute_input", "input"],
    ["compute_infer", "infer"],
    ["compute_output", "output"],
  ];
  const REASONS = ["REJECTED", "CANCELED", "BACKEND", "OTHER"];

  const histories = new Map(); // "key/version" -> [{t, stats}]
  const cards = new Map(); // "key/version" -> the card's elements
  let lastDocument = null;

  // ---- formatting -------------------------------------------------------------------------

  const number = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });
  const decimal = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });

  function fmtRate(x) {
    if (x === null || x === undefined || !isFinite(x)) return "–";
    return x < 10 ? decimal.format(x) : number.format(x);
  }

  function fmtUs(us) {
    if (us === null || us === undefined || !isFinite(us)) return "–";
    if (us < 1000) return `${number.format(us)} µs`;
    if (us < 1e6) return `${decimal.format(us / 1000)} ms`;
    return `${decimal.format(us / 1e6)} s`;
  }

  function fmtBytes(bytes) {
    if (bytes === null || bytes === undefined) return "–";
    const units = ["B", "KB", "MB", "GB", "TB"];
    let value = bytes;
    let unit = 0;
    while (value >= 1000 && unit < units.length - 1) {
      value /= 1000;
      unit += 1;
    }
    return `${value < 10 ? decimal.format(value) : number.format(value)} ${units[unit]}`;
  }

  function fmtDuration(seconds) {
    const s = Math.floor(seconds);
    if (s < 60) return `${s} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
    return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  }

  // ---- DOM helpers ------------------------------------------------------------------------

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function svg(tag, attributes) {
    const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
    for (const [key, value] of Object.entries(attributes || {})) node.setAttribute(key, value);
    return node;
  }

  function setText(id, text) {
    const node = document.getElementById(id);
    if (node.textContent !== text) node.textContent = text;
  }

  function metric(label, field) {
    const box = el("div", "metric");
    box.append(el("span", "label", label));
    const value = el("span", "value", "–");
    value.dataset.field = field;
    box.append(value);
    return [box, value];
  }

  // ---- history and differences ------------------------------------------------------------

  function remember(key, t, stats) {
    let list = histories.get(key);
    const last = list && list[list.length - 1];
    if (last && last.t === t) return list; // the same document drawn again
    // A reload starts the counters again: so does the history.
    if (!list || (last && (stats.success < last.stats.success || stats.execution_count < last.stats.execution_count))) {
      list = [];
      histories.set(key, list);
    }
    list.push({ t, stats });
    while (list.length > 2 && list[0].t < t - HISTORY_S - 2) list.shift();
    return list;
  }

  // The newest sample at least `span` seconds older than the latest (or the oldest there is).
  function before(list, span) {
    const latest = list[list.length - 1];
    for (let i = list.length - 2; i >= 0; i -= 1) {
      if (list[i].t <= latest.t - span) return list[i];
    }
    return list[0];
  }

  function change(list, span, get) {
    const latest = list[list.length - 1];
    const old = before(list, span);
    const dt = latest.t - old.t;
    return { value: get(latest.stats) - get(old.stats), dt, old: old.stats, latest: latest.stats };
  }

  function rate(list, span, get) {
    const { value, dt } = change(list, span, get);
    return dt > 0 ? value / dt : null;
  }

  const requests = (s) => s.success + s.fail;

  // ---- a model card -----------------------------------------------------------------------

  function createCard(model) {
    const root = el("article", "model");
    root.dataset.model = model.name;
    root.dataset.version = model.version;
    const header = el("header");
    const title = el("h2", "", model.name);
    if (model.version) title.append(el("span", "muted", ` v${model.version}`));
    const state = el("span", "badge");
    state.dataset.field = "state";
    header.append(title, state);
    const meta = el("p", "meta");
    const reason = el("p", "reason hidden");
    reason.dataset.field = "reason";
    const idle = el("p", "idle hidden", "no requests yet");
    const body = el("div", "hidden");

    const live = el("div", "live");
    const [rateBox, rateValue] = metric("requests/s", "rate");
    const [p50Box, p50Value] = metric("p50", "p50");
    const [p99Box, p99Value] = metric("p99", "p99");
    const [pendingBox, pendingValue] = metric("in flight", "pending");
    live.append(rateBox, p50Box, p99Box, pendingBox);
    // A language model's figures (stats.llm, its vLLM metrics): shown only for such models.
    const llmBox = el("div", "live hidden");
    const [tokensBox, tokensValue] = metric("output tokens/s", "tokens-rate");
    const [ttftBox, ttftValue] = metric("first token", "ttft");
    const [tpotBox, tpotValue] = metric("per output token", "tpot");
    const [seqBox, seqValue] = metric("running · waiting", "sequences");
    llmBox.append(tokensBox, ttftBox, tpotBox, seqBox);
    const llmNote = el("div", "hist-note hidden");
    llmNote.dataset.field = "llm-note";
    const spark = svg("svg", { class: "spark", viewBox: `0 0 ${HISTORY_S} 20`, preserveAspectRatio: "none", "aria-hidden": "true" });
    const area = svg("polygon", { class: "area" });
    const line = svg("polyline", { "vector-effect": "non-scaling-stroke" });
    spark.append(area, line);

    const splitTitle = el("h3", "", `where a request's time goes (last ${WINDOW_S} s)`);
    const splitBar = el("div", "split-bar");
    const legend = el("ul", "legend");
    const segments = {};
    const legendValues = {};
    for (const [part, label] of [...PARTS, ["other", "other"]]) {
      segments[part] = el("span", part);
      splitBar.append(segments[part]);
      const item = el("li");
      item.append(el("i", part), `${label} `);
      legendValues[part] = el("span", "", "–");
      legendValues[part].dataset.field = `time-${part}`;
      item.append(legendValues[part]);
      legend.append(item);
    }

    const histTitle = el("h3", "", "batch sizes (executions)");
    const histBars = el("div", "hist-bars");
    histBars.dataset.field = "batches";
    const histLabels = el("div", "hist-labels");
    const histNote = el("div", "hist-note");
    histNote.dataset.field = "batch-note";

    const failTitle = el("h3", "", "failures by reason");
    const failures = el("div", "counts");
    const failValues = {};
    for (const reason of REASONS) {
      const item = el("span", "", `${reason.toLowerCase()} `);
      failValues[reason] = el("b", "", "0");
      failValues[reason].dataset.field = `fail-${reason}`;
      item.append(failValues[reason]);
      failures.append(item);
    }
    const cache = el("div", "counts hidden");
    cache.dataset.field = "cache";

    body.append(live, llmBox, llmNote, spark, splitTitle, splitBar, legend, histTitle, histBars, histLabels, histNote, failTitle, failures, cache);
    root.append(header, meta, reason, idle, body);
    return {
      root, state, meta, reason, idle, body, rateValue, p50Value, p99Value, pendingValue,
      line, area, segments, legendValues, histBars, histLabels, histNote, histTitle, bins: "",
      splitTitle,
      failValues, cache,
      llmBox, llmNote, tokensValue, ttftValue, tpotValue, seqValue,
    };
  }

  function describe(model) {
    if (!model.backend) return model.state === "UNLOADED" ? "not loaded" : "";
    const parts = [model.ensemble ? "ensemble" : model.backend];
    for (const group of model.instances || []) {
      parts.push(`${group.count} × ${group.kind.replace("KIND_", "")}`);
    }
    if (model.max_batch_size > 0) parts.push(`max batch ${model.max_batch_size}`);
    if (model.dynamic_batching) parts.push("dynamic batching");
    if (model.sequence_batching) parts.push("sequence batching");
    return parts.join(" · ");
  }

  // Histogram bins: one per batch size up to 16, then powers of two.
  function binsFor(maxBatch, seen) {
    const top = Math.max(maxBatch, seen, 1);
    const bins = [];
    if (top <= 16) {
      for (let size = 1; size <= top; size += 1) bins.push([size, size]);
      return bins;
    }
    for (let size = 1; size <= 4; size += 1) bins.push([size, size]);
    for (let low = 5, high = 8; low <= top; low = high + 1, high *= 2) bins.push([low, Math.min(high, top)]);
    return bins;
  }

  function drawHistogram(card, model, list) {
    const { value: executions, latest, old } = change(list, WINDOW_S, (s) => s.execution_count);
    const recent = executions > 0;
    const counts = {};
    let seen = 0;
    for (const [size, count] of Object.entries(latest.batches)) {
      const value = recent ? count - (old.batches[size] || 0) : count;
      if (value > 0) {
        counts[size] = value;
        seen = Math.max(seen, Number(size));
      }
    }
    const bins = binsFor(model.max_batch_size, seen);
    const signature = bins.map((b) => b.join("-")).join(",");
    if (card.bins !== signature) {
      card.bins = signature;
      card.histBars.replaceChildren();
      card.histLabels.replaceChildren();
      for (const [low, high] of bins) {
        const bar = el("div", "hist-bar");
        bar.dataset.size = low === high ? `${low}` : `${low}-${high}`;
        bar.append(el("span"));
        card.histBars.append(bar);
        card.histLabels.append(el("span", "", bar.dataset.size));
      }
    }
    const totals = bins.map(([low, high]) => {
      let total = 0;
      for (const [size, count] of Object.entries(counts)) {
        if (Number(size) >= low && Number(size) <= high) total += count;
      }
      return total;
    });
    const most = Math.max(1, ...totals);
    card.histBars.querySelectorAll(".hist-bar").forEach((bar, index) => {
      bar.dataset.count = `${totals[index]}`;
      bar.title = `batch size ${bar.dataset.size}: ${totals[index]} executions`;
      bar.firstChild.style.height = `${(100 * totals[index]) / most}%`;
    });
    const inferences = recent
      ? latest.inference_count - old.inference_count
      : latest.inference_count;
    const count = recent ? executions : latest.execution_count;
    const average = count > 0 ? inferences / count : null;
    card.histTitle.textContent = recent
      ? `batch sizes (executions, last ${WINDOW_S} s)`
      : "batch sizes (executions since load)";
    card.histNote.textContent = average === null
      ? (model.max_batch_size > 0 ? "no executions yet" : "this model does not batch (max_batch_size 0)")
      : `average batch ${decimal.format(average)} · ${number.format(count)} executions`;
  }

  function drawSplit(card, list) {
    const { value: successes, latest, old } = change(list, WINDOW_S, (s) => s.success);
    const source = successes > 0 ? { n: successes, a: latest.ns, b: old.ns } : { n: latest.success, a: latest.ns, b: null };
    const per = (part) => (source.n > 0 ? (source.a[part] - (source.b ? source.b[part] : 0)) / source.n / 1000 : null);
    card.splitTitle.textContent = successes > 0
      ? `where a request's time goes (last ${WINDOW_S} s)`
      : "where a request's time goes (since load)";
    const total = per("request");
    let known = 0;
    const values = {};
    for (const [part] of PARTS) {
      values[part] = per(part);
      known += values[part] || 0;
    }
    values.other = total === null ? null : Math.max(0, total - known);
    for (const part of Object.keys(card.segments)) {
      const share = total ? (100 * (values[part] || 0)) / Math.max(total, known) : 0;
      card.segments[part].style.width = `${share}%`;
      card.legendValues[part].textContent = fmtUs(values[part]);
    }
  }

  // A histogram's mean (µs) over the last WINDOW_S seconds, or since load when none ended then.
  function llmMean(list, field) {
    const get = (s) => (s.llm && s.llm[field]) || { count: 0, sum_s: 0 };
    const { value: count, latest, old } = change(list, WINDOW_S, (s) => get(s).count);
    const now = get(latest);
    if (count > 0) return { us: (1e6 * (now.sum_s - get(old).sum_s)) / count, recent: true };
    return { us: now.count > 0 ? (1e6 * now.sum_s) / now.count : null, recent: false };
  }

  function drawLlm(card, list, llm) {
    const tokens = rate(list, RATE_SPAN_S, (s) => (s.llm ? s.llm.generation_tokens || 0 : 0));
    const prompt = rate(list, RATE_SPAN_S, (s) => (s.llm ? s.llm.prompt_tokens || 0 : 0));
    const ttft = llmMean(list, "ttft");
    const tpot = llmMean(list, "tpot");
    card.tokensValue.textContent = fmtRate(tokens === null ? 0 : tokens);
    card.ttftValue.textContent = fmtUs(ttft.us);
    card.tpotValue.textContent = fmtUs(tpot.us);
    card.seqValue.textContent = `${number.format(llm.running || 0)} · ${number.format(llm.waiting || 0)}`;
    const kv = llm.kv_cache_usage === undefined ? "" : ` · KV cache ${decimal.format(100 * llm.kv_cache_usage)} % reserved`;
    card.llmNote.textContent = `token times: means ${ttft.recent || tpot.recent ? `of the last ${WINDOW_S} s` : "since load"} · prompt ${fmtRate(prompt === null ? 0 : prompt)} tokens/s${kv}`;
  }

  function drawSpark(card, list) {
    const points = [];
    const now = list[list.length - 1].t;
    // The history there is (10 to 60 s) spans the whole width.
    const span = Math.min(HISTORY_S, Math.max(10, now - list[0].t));
    for (let i = 1; i < list.length; i += 1) {
      const dt = list[i].t - list[i - 1].t;
      if (dt <= 0) continue;
      const x = ((list[i].t - now + span) / span) * HISTORY_S;
      points.push([x, (requests(list[i].stats) - requests(list[i - 1].stats)) / dt]);
    }
    const top = Math.max(1, ...points.map((p) => p[1]));
    const xy = points.map(([x, y]) => `${Math.max(0, x).toFixed(2)},${(20 - (19 * y) / top).toFixed(2)}`);
    card.line.setAttribute("points", xy.join(" "));
    card.area.setAttribute("points", xy.length ? `${xy[0].split(",")[0]},20 ${xy.join(" ")} ${xy[xy.length - 1].split(",")[0]},20` : "");
  }

  function updateCard(card, model, t) {
    card.state.textContent = model.state;
    card.state.className = `badge ${model.state}`;
    const meta = describe(model);
    if (card.meta.textContent !== meta) card.meta.textContent = meta;
    card.reason.textContent = model.reason || "";
    card.reason.classList.toggle("hidden", !model.reason);
    const stats = model.stats;
    if (!stats) {
      card.idle.classList.add("hidden");
      card.body.classList.add("hidden");
      return 0;
    }
    const list = remember(`${model.key}/${model.version}`, t, stats);
    const used = requests(stats) > 0 || stats.pending > 0;
    card.idle.classList.toggle("hidden", used);
    card.body.classList.toggle("hidden", !used);
    const current = rate(list, RATE_SPAN_S, requests);
    card.rateValue.textContent = fmtRate(current === null ? 0 : current);
    card.p50Value.textContent = fmtUs(stats.latency && stats.latency.p50_us);
    card.p99Value.textContent = fmtUs(stats.latency && stats.latency.p99_us);
    card.pendingValue.textContent = number.format(stats.pending);
    card.llmBox.classList.toggle("hidden", !stats.llm);
    card.llmNote.classList.toggle("hidden", !stats.llm);
    if (stats.llm) drawLlm(card, list, stats.llm);
    if (used) {
      drawSpark(card, list);
      drawSplit(card, list);
      drawHistogram(card, model, list);
      for (const reason of REASONS) {
        const count = stats.failures[reason] || 0;
        card.failValues[reason].textContent = number.format(count);
        card.failValues[reason].className = count > 0 ? "nonzero" : "";
      }
      card.cache.classList.toggle("hidden", !stats.cache);
      if (stats.cache) {
        const lookups = stats.cache.hits + stats.cache.misses;
        const share = lookups > 0 ? `${decimal.format((100 * stats.cache.hits) / lookups)} %` : "–";
        card.cache.textContent = `cache hit rate ${share} (${number.format(stats.cache.hits)} hits, ${number.format(stats.cache.misses)} misses)`;
      }
    }
    return current || 0;
  }

  // ---- the whole page ---------------------------------------------------------------------

  function drawServer(doc, total, inferences) {
    const server = doc.server;
    setText("server-id", server.id ? `· ${server.id}` : "");
    const health = document.getElementById("health");
    health.textContent = server.ready ? "ready" : server.live ? "not ready" : "not live";
    health.className = `badge ${server.ready ? "ok" : "bad"}`;
    setText("updated", `updated ${new Date().toLocaleTimeString()}`);
    setText("total-rate", fmtRate(total));
    setText("total-sub", `${fmtRate(inferences)} inferences/s`);
    const proc = doc.process;
    setText("cpu", proc.cpu_percent === null ? "–" : `${number.format(proc.cpu_percent)} %`);
    setText("cpu-sub", `of one core; ${proc.cpus} ${proc.cpus === 1 ? "CPU" : "CPUs"}`);
    setText("rss", fmtBytes(proc.rss_bytes));
    setText("rss-sub", proc.processes ? `resident, ${proc.processes} ${proc.processes === 1 ? "process" : "processes"}` : "");
    const connections = doc.connections;
    if (connections) {
      const total = Object.values(connections).reduce((a, b) => a + b, 0);
      setText("connections", number.format(total));
      setText("connections-sub", Object.entries(connections).map(([name, count]) => `${name === "grpc" ? "gRPC" : name.toUpperCase()} ${count}`).join(" · "));
    } else {
      setText("connections", "–");
      setText("connections-sub", "not available here");
    }
    const machine = doc.machine;
    setText("machine", machine.cpu_utilization === null ? "–" : `${number.format(100 * machine.cpu_utilization)} %`);
    const shm = doc.shared_memory;
    // Python models whose rings grew past their start size (shm-growth-byte-size).
    const grown = shm && shm.rings ? Object.entries(shm.rings).filter(([, r]) => r.reserved_bytes > r.initial_bytes) : [];
    const grownText = grown.length ? `; rings grown: ${grown.map(([name, r]) => `${name} ${fmtBytes(r.reserved_bytes)} (from ${fmtBytes(r.initial_bytes)})`).join(", ")}` : "";
    const shmText = shm ? `; /dev/shm ${fmtBytes(shm.used_bytes)} used, ${fmtBytes(shm.reserved_bytes)} reserved by models, of ${fmtBytes(shm.size_bytes)}${shm.fallbacks ? `, ${number.format(shm.fallbacks)} messages without room` : ""}${grownText}` : "";
    setText("machine-sub", (machine.memory_total_bytes ? `CPU busy; memory ${fmtBytes(machine.memory_used_bytes)} of ${fmtBytes(machine.memory_total_bytes)}` : "CPU busy") + shmText);
    setText("uptime", fmtDuration(doc.uptime_s));
    setText("uptime-sub", `oceanus ${server.version} · ${server.control_mode} model control`);
  }

  function draw(doc) {
    const container = document.getElementById("models");
    const onlyActive = document.getElementById("only-active").checked;
    const seen = new Set();
    let total = 0;
    let inferences = 0;
    let ready = 0;
    // Models that have served requests first (each group in the server's order, by name).
    const used = (m) => m.stats && (requests(m.stats) > 0 || m.stats.pending > 0);
    const ordered = [...doc.models.filter(used), ...doc.models.filter((m) => !used(m))];
    for (const model of ordered) {
      const key = `${model.key}/${model.version}`;
      seen.add(key);
      let card = cards.get(key);
      if (!card) {
        card = createCard(model);
        cards.set(key, card);
      }
      total += updateCard(card, model, doc.time);
      if (model.stats) {
        inferences += rate(histories.get(key), RATE_SPAN_S, (s) => s.inference_count) || 0;
      }
      if (model.state === "READY") ready += 1;
      card.root.classList.toggle("hidden", onlyActive && !used(model));
      container.append(card.root); // in that order (moving a node is cheap)
    }
    for (const [key, card] of cards) {
      if (!seen.has(key)) {
        card.root.remove();
        cards.delete(key);
        histories.delete(key);
      }
    }
    setText("model-count", `${doc.models.length} models and versions, ${ready} ready`);
    drawServer(doc, total, inferences);
  }

  async function poll() {
    const started = performance.now();
    try {
      const response = await fetch("status.json", { cache: "no-store" });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      lastDocument = await response.json();
      draw(lastDocument);
      // Once a second, whatever the request took.
      setTimeout(poll, Math.max(0, POLL_MS - (performance.now() - started)));
    } catch (error) {
      const health = document.getElementById("health");
      health.textContent = "unreachable";
      health.className = "badge bad";
      setTimeout(poll, 2 * POLL_MS);
    }
  }

  document.getElementById("only-active").addEventListener("change", () => {
    if (lastDocument) draw(lastDocument);
  });
  poll();
})();
