// agent-reach console: live regions and action forms, without reloading the page.
// No framework and no build step: the server renders HTML; this only fetches it.
"use strict";

(function () {
  var csrf = document.querySelector('meta[name="csrf-token"]').getAttribute("content");

  function flash(ok, message) {
    var box = document.getElementById("flash");
    box.className = ok ? "ok" : "error";
    box.textContent = message;
  }

  // A live region is replaced by its server-rendered HTML every data-every ms, unless someone
  // is typing in it (a reason for a decision): then it waits for the next round.
  function busy(region) {
    var inputs = region.querySelectorAll("input:not([type=hidden])");
    for (var i = 0; i < inputs.length; i++) {
      if (inputs[i] === document.activeElement || inputs[i].value) return true;
    }
    return false;
  }

  function refresh(region) {
    return fetch(region.dataset.live, { credentials: "same-origin", headers: { "X-Requested-With": "fetch" } })
      .then(function (response) {
        if (response.status === 401) {
          window.location.assign("/login?next=" + encodeURIComponent(window.location.pathname));
          return null;
        }
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (html !== null && html !== region.dataset.shown && !busy(region)) {
          region.innerHTML = html;
          region.dataset.shown = html;
          region.dataset.updated = String(Date.now());
        }
      })
      .catch(function () { /* the next round tries again */ });
  }

  var region = document.getElementById("live");
  if (region) {
    var every = parseInt(region.dataset.every || "2000", 10);
    var tick = function () { refresh(region).then(function () { window.setTimeout(tick, every); }); };
    tick();
  }

  // Action forms go by fetch, with the session's CSRF token in a header as well as in the form.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (!form.classList || !form.classList.contains("action")) return;
    event.preventDefault();
    var button = event.submitter || form.querySelector("button");
    var action = (button && button.getAttribute("formaction")) || form.getAttribute("action");
    form.querySelectorAll("button").forEach(function (b) { b.disabled = true; });
    fetch(action, {
      method: "POST",
      credentials: "same-origin",
      headers: { "X-CSRF-Token": csrf, "X-Requested-With": "fetch" },
      body: new URLSearchParams(new FormData(form)),
    })
      .then(function (response) {
        return response.json().catch(function () { return { ok: false, message: "HTTP " + response.status }; });
      })
      .then(function (answer) {
        flash(answer.ok, answer.message);
        form.querySelectorAll("input:not([type=hidden])").forEach(function (i) { i.value = ""; });
        if (region) return refresh(region);
      })
      .catch(function (error) { flash(false, String(error)); })
      .then(function () { form.querySelectorAll("button").forEach(function (b) { b.disabled = false; }); });
  });
})();
