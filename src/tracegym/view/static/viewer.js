// tracegym viewer: click a token to pin its details (id, text, logprob) below the tokens; hovering already
// shows them in the token's title, so every page reads the same without this script.
(function () {
  "use strict";
  function detail(view) {
    var box = view.querySelector(".token-detail");
    if (!box) {
      box = document.createElement("div");
      box.className = "token-detail";
      box.setAttribute("aria-live", "polite");
      view.appendChild(box);
    }
    return box;
  }
  document.addEventListener("click", function (event) {
    var token = event.target.closest ? event.target.closest(".tokens .t") : null;
    if (!token) { return; }
    var view = token.closest(".tokens-view");
    var seg = token.closest(".seg");
    var picked = view.querySelector(".t.picked");
    if (picked) { picked.classList.remove("picked"); }
    token.classList.add("picked");
    var parts = ["id " + token.dataset.id, "text " + JSON.stringify(token.textContent)];
    if (token.dataset.lp !== undefined) {
      var lp = parseFloat(token.dataset.lp);
      parts.push("logprob " + lp.toFixed(4), "p " + Math.exp(lp).toFixed(3));
    }
    parts.push(token.classList.contains("s") ? "sampled" : "prompt");
    if (token.classList.contains("loss")) { parts.push("trained"); }
    if (token.classList.contains("private")) { parts.push("private reasoning"); }
    if (seg) {
      parts.push("node " + seg.dataset.node);
      if (seg.dataset.version !== undefined) { parts.push("policy v" + seg.dataset.version); }
    }
    detail(view).textContent = parts.join(" · ");
  });
})();
