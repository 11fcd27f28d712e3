// agent-rl trajectory viewer: renders the JSON embedded in this page (see agent_rl/viewer/report.py).
"use strict";
(function () {
  const page = JSON.parse(document.getElementById("page").textContent);
  const $ = (sel) => document.querySelector(sel);
  const LAG = ["#c8efd0", "#fff1a8", "#ffd08a", "#ffa98a", "#ff7b7b"]; // lag 0, 1, 2, 3, >=4
  const cache = new Map(); // step -> parsed step JSON
  let current = null; // parsed JSON of the step on screen

  const fmt = (x, d = 3) => (x === null || x === undefined ? "–" : Number(x).toFixed(d));
  const fmtW = (w) => (w === null || w === undefined ? "–" : w >= 1e4 || w < 1e-3 ? w.toExponential(2) : w.toFixed(3));

  function stepData(step) {
    if (!cache.has(step)) {
      const el = document.getElementById("step-" + step);
      cache.set(step, el ? JSON.parse(el.textContent) : null);
    }
    return cache.get(step);
  }

  function lagColour(lag) {
    return LAG[Math.max(0, Math.min(lag, LAG.length - 1))];
  }

  function weightColour(logRatio) {
    // log(π/μ) per token: red above 1, blue below; full strength at |log r| >= 1
    const a = Math.min(Math.abs(logRatio), 1) * 0.75;
    if (a < 0.02) return "transparent";
    return logRatio > 0 ? `rgba(214, 48, 49, ${a.toFixed(3)})` : `rgba(9, 132, 227, ${a.toFixed(3)})`;
  }

  function mismatchColour(gap) {
    // |log π − log μ| of a token sampled by the learner's own version (engine vs learner, same weights):
    // purple, full strength at >= 0.1 (rollout/logprob_mismatch_* in the metrics)
    const a = Math.min(gap / 0.1, 1) * 0.8;
    return a < 0.02 ? "transparent" : `rgba(128, 0, 160, ${a.toFixed(3)})`;
  }

  function teacherColour(lt) {
    // the teacher's log-prob of the sampled token: transparent when it finds it likely (p >= 0.37), red
    // at full strength where p <= 0.01 (distill/disagree_frac counts log μ − log π_T > ln 10)
    const a = Math.min(Math.max(-1 - lt, 0) / (Math.log(100) - 1), 1) * 0.8;
    return a < 0.02 ? "transparent" : `rgba(214, 48, 49, ${a.toFixed(3)})`;
  }

  function colourOf(tok, mode) {
    if (tok.dataset.masked === "1") return "";
    if (mode === "lag") return lagColour(Number(tok.dataset.lag));
    if (mode === "teacher") return tok.dataset.t === undefined ? "#eef0f3" : teacherColour(Number(tok.dataset.t));
    if (tok.dataset.lr === undefined) return "transparent";
    if (mode === "mismatch") return tok.dataset.lag === "0" ? mismatchColour(Math.abs(Number(tok.dataset.lr))) : "#eef0f3";
    return weightColour(Number(tok.dataset.lr));
  }

  function recolour() {
    const mode = $("#colour").value;
    document.body.dataset.colour = mode;
    for (const tok of document.querySelectorAll("#groups .tok")) tok.style.backgroundColor = colourOf(tok, mode);
    legend(mode);
  }

  function legend(mode) {
    const el = $("#legend");
    el.textContent = "";
    const add = (text, bg) => {
      const s = document.createElement("span");
      s.className = "sw";
      s.textContent = text;
      s.style.backgroundColor = bg;
      el.appendChild(s);
    };
    if (mode === "lag") {
      ["lag 0", "1", "2", "3", "≥4"].forEach((t, i) => add(t, LAG[i]));
    } else if (mode === "teacher") {
      add("π_T ≥ 0.37", "transparent");
      add("0.1", teacherColour(Math.log(0.1)));
      add("0.03", teacherColour(Math.log(0.03)));
      add("≤ 0.01", teacherColour(Math.log(0.01)));
      add("not scored", "#eef0f3");
    } else if (mode === "mismatch") {
      add("|log π − log μ| < 0.002", "transparent");
      add("0.02", mismatchColour(0.02));
      add("0.05", mismatchColour(0.05));
      add("≥ 0.1", mismatchColour(0.1));
      add("older version: not measured", "#eef0f3");
    } else {
      add("π/μ ≤ 0.37", weightColour(-1));
      add("0.7", weightColour(-0.35));
      add("1", "transparent");
      add("1.4", weightColour(0.35));
      add("≥ 2.7", weightColour(1));
    }
    add("masked", "transparent");
    el.lastChild.style.color = "#9aa0ab";
  }

  function renderSteps() {
    $("#run").textContent = page.run;
    const body = $("#steps tbody");
    for (const s of page.steps) {
      const tr = document.createElement("tr");
      tr.dataset.step = s.step;
      for (const v of [s.step, fmt(s.reward_mean), fmt(s.ess_ratio), fmt(s.staleness_mean, 1), `${s.trajectories}/${s.batch_trajectories}`]) {
        const td = document.createElement("td");
        td.textContent = v;
        tr.appendChild(td);
      }
      tr.addEventListener("click", () => select(s.step));
      body.appendChild(tr);
    }
  }

  function select(step) {
    current = stepData(step);
    for (const tr of document.querySelectorAll("#steps tbody tr")) tr.classList.toggle("selected", Number(tr.dataset.step) === step);
    if (location.hash !== "#step=" + step) history.replaceState(null, "", "#step=" + step);
    render();
  }

  function visible(trajs) {
    const f = $("#filter").value;
    if (f === "all") return new Set(trajs);
    if (f === "top") {
      const ranked = trajs.filter((t) => t.weight !== null).sort((a, b) => b.weight - a.weight);
      return new Set(ranked.slice(0, 5));
    }
    return new Set(trajs.filter((t) => t.flags[f]));
  }

  function render() {
    const root = $("#groups");
    root.textContent = "";
    const s = current;
    const summary = page.steps.find((x) => x.step === s.step);
    $("#step-head").innerHTML = "";
    const head = $("#step-head");
    const bits = [
      ["step", s.step],
      ["trained by version", s.learner_version],
      ["reward (batch)", fmt(summary.reward_mean)],
      ["ESS/B", fmt(summary.ess_ratio)],
      ["staleness mean/max", `${fmt(summary.staleness_mean, 1)} / ${fmt(summary.staleness_max, 0)}`],
      ["recorded", `${summary.trajectories} of ${summary.batch_trajectories} trajectories, ${summary.groups} groups`],
    ];
    bits.forEach(([k, v], i) => {
      if (i) head.appendChild(document.createTextNode(" · "));
      head.appendChild(document.createTextNode(k + " "));
      const b = document.createElement("b");
      b.textContent = v;
      head.appendChild(b);
    });
    const all = s.groups.flatMap((g) => g.trajectories);
    const show = visible(all);
    let shown = 0;
    for (const g of s.groups) {
      const members = g.trajectories.filter((t) => show.has(t));
      if (!members.length) continue;
      const div = document.createElement("div");
      div.className = "group";
      const h = document.createElement("h2");
      h.textContent = `group ${g.group_id}` + (g.task_id ? ` · task ${g.task_id}` : "") + ` · ${g.trajectories.length} samples`;
      div.appendChild(h);
      for (const t of members) {
        div.appendChild(renderTrajectory(t, s.learner_version));
        shown += 1;
      }
      root.appendChild(div);
    }
    if (!shown) {
      const p = document.createElement("p");
      p.className = "empty";
      p.textContent = "no trajectory of this step matches the filter";
      root.appendChild(p);
    }
    recolour();
  }

  function field(parent, key, value, cls) {
    const span = document.createElement("span");
    if (cls) span.className = cls;
    if (key) {
      const k = document.createElement("span");
      k.className = "k";
      k.textContent = key + " ";
      span.appendChild(k);
    }
    span.appendChild(document.createTextNode(value));
    parent.appendChild(span);
  }

  function badge(parent, cls, text) {
    const b = document.createElement("span");
    b.className = "badge " + cls;
    b.textContent = text;
    parent.appendChild(b);
  }

  function renderTrajectory(t, trainedVersion) {
    const card = document.createElement("article");
    card.className = "traj";
    card.dataset.uid = t.uid;
    card.dataset.versions = t.versions.join(",");
    const head = document.createElement("div");
    head.className = "traj-head";
    field(head, "", t.uid, "uid");
    field(head, "reward", fmt(t.reward));
    field(head, "baseline", fmt(t.baseline));
    field(head, "advantage", fmt(t.advantage));
    const c = page.is_truncation;
    field(head, "weight", t.weight === null ? "–" : `${fmtW(t.weight)} (used ${fmtW(Math.min(t.weight, c))})`);
    field(head, "versions", t.versions.length ? t.versions.join("→") : "–");
    field(head, "turns", String(t.turns.length || t.blocks.filter((b) => b.kind === "model").length));
    field(head, "end", t.finish_reason || "–");
    if (t.flags.error) badge(head, "error", "tool error");
    if (t.flags.void) badge(head, "void", "masked");
    if (t.flags.truncated) badge(head, "truncated", "truncated");
    if (t.versions.length > 1) badge(head, "partial", "continued across a weight update");
    card.appendChild(head);

    const body = document.createElement("div");
    body.className = "traj-body";
    const prompt = document.createElement("div");
    prompt.className = "prompt";
    prompt.textContent = t.prompt;
    prompt.hidden = !$("#show-prompt").checked;
    body.appendChild(prompt);
    let turn = 0;
    for (const blk of t.blocks) {
      if (blk.kind === "env") {
        const env = document.createElement("span");
        env.className = "env";
        for (const text of blk.text) env.appendChild(token(text, { masked: true }));
        body.appendChild(env);
        continue;
      }
      const info = t.turns[turn] || null;
      const label = document.createElement("span");
      label.className = "turn-label";
      let text = `turn ${turn + 1} · sampled by v${blk.versions.join(", v")}`;
      if (info && info.code_ran) text += ` · code ran, exit ${info.exit_code}${info.timed_out ? " (timed out)" : ""}`;
      if (info && info.aborts) text += ` · interrupted ${info.aborts}× by weight updates`;
      label.textContent = text;
      body.appendChild(label);
      turn += 1;
      let code = null;
      for (let i = 0; i < blk.text.length; i++) {
        const tok = token(blk.text[i], {
          masked: !blk.trained,
          v: blk.v[i],
          lag: trainedVersion - blk.v[i],
          b: blk.b[i],
          c: blk.c ? blk.c[i] : null,
          t: blk.t ? blk.t[i] : null,
          vchange: i > 0 && blk.v[i] !== blk.v[i - 1],
        });
        if (blk.code[i]) {
          if (!code) {
            code = document.createElement("span");
            code.className = "code";
            body.appendChild(code);
          }
          code.appendChild(tok);
        } else {
          code = null;
          body.appendChild(tok);
        }
      }
    }
    card.appendChild(body);
    return card;
  }

  function token(text, o) {
    const span = document.createElement("span");
    span.className = "tok" + (o.masked ? " masked" : "") + (o.vchange ? " vchange" : "");
    span.textContent = text;
    span.dataset.masked = o.masked ? "1" : "0";
    if (o.v !== undefined) {
      span.dataset.v = o.v;
      span.dataset.lag = o.lag;
      span.dataset.b = o.b;
      if (o.c !== null && o.c !== undefined) span.dataset.lr = (o.c - o.b).toFixed(4);
      if (o.t !== null && o.t !== undefined) span.dataset.t = o.t;
    }
    return span;
  }

  function tip(ev) {
    const tok = ev.target.closest ? ev.target.closest(".tok") : null;
    const el = $("#tip");
    if (!tok || tok.dataset.v === undefined) {
      el.hidden = true;
      return;
    }
    const b = Number(tok.dataset.b);
    let text = `version ${tok.dataset.v} (lag ${tok.dataset.lag})\nlog μ ${b.toFixed(4)}`;
    if (tok.dataset.lr !== undefined) {
      const lr = Number(tok.dataset.lr);
      text += `\nlog π ${(b + lr).toFixed(4)}\nπ/μ ${Math.exp(lr).toFixed(4)}`;
      if (tok.dataset.lag === "0") text += `\nmismatch |log π − log μ| ${Math.abs(lr).toExponential(2)}`;
    }
    if (tok.dataset.t !== undefined) {
      const t = Number(tok.dataset.t);
      text += `\nteacher log π_T ${t.toFixed(4)}\nlog μ − log π_T ${(b - t).toFixed(4)}`;
    }
    if (tok.dataset.masked === "1") text += "\nmasked (no loss)";
    el.textContent = text;
    el.hidden = false;
    el.style.left = ev.clientX + 12 + "px";
    el.style.top = ev.clientY + 12 + "px";
  }

  renderSteps();
  $("#colour").addEventListener("change", recolour);
  $("#filter").addEventListener("change", render);
  $("#show-prompt").addEventListener("change", () => {
    for (const p of document.querySelectorAll(".prompt")) p.hidden = !$("#show-prompt").checked;
  });
  $("#groups").addEventListener("mousemove", tip);
  $("#groups").addEventListener("mouseleave", () => ($("#tip").hidden = true));
  const fromHash = /#step=(\d+)/.exec(location.hash);
  const wanted = fromHash ? Number(fromHash[1]) : null;
  const steps = page.steps.map((s) => s.step);
  select(steps.includes(wanted) ? wanted : steps[steps.length - 1]);
})();
