// mellan dashboard: a small progressive enhancement, in plain JavaScript.
// Every page works without it (forms post, links refresh); with it:
//  - parts marked data-live follow a server-sent event stream and update in place;
//  - forms marked data-confirm ask first; data-inplace forms post in the background
//    (with the session's CSRF token in X-CSRF-Token) and let the live stream show the result;
//  - data-copy buttons copy a field's text.
"use strict";

(function () {
  const status = document.getElementById("live-status");

  function say(text, down) {
    if (!status) return;
    status.textContent = text;
    status.hidden = !text;
    status.classList.toggle("down", Boolean(down));
  }

  function put(part) {
    const el = document.getElementById(part.target);
    if (!el) return;
    if (part.mode === "prepend") {
      el.insertAdjacentHTML("afterbegin", part.html);
      el.querySelectorAll("[data-empty]").forEach((row) => row.remove());
    } else {
      el.innerHTML = part.html;
    }
    wire(el);
  }

  function follow(el) {
    const source = new EventSource(el.dataset.live);
    source.addEventListener("open", () => say("live", false));
    source.addEventListener("html", (ev) => put(JSON.parse(ev.data)));
    source.addEventListener("signedout", (ev) => {
      source.close();
      const why = JSON.parse(ev.data);
      say("signed out (" + why.rule + "): reload to sign in again", true);
    });
    source.addEventListener("error", () => {
      if (source.readyState === EventSource.CLOSED) {
        say("live updates stopped: reload the page", true);
      } else {
        say("reconnecting…", true);
      }
    });
  }

  function csrfOf(form) {
    const field = form.querySelector('input[name="csrf"]');
    return field ? field.value : "";
  }

  async function postInPlace(form) {
    const body = new URLSearchParams(new FormData(form));
    try {
      const response = await fetch(form.action, {
        method: "POST",
        body: body,
        credentials: "same-origin",
        headers: { "Accept": "application/json", "X-CSRF-Token": csrfOf(form) },
      });
      const answer = await response.json();
      say(answer.ok ? answer.notice : "refused (" + answer.error.rule + "): " + answer.error.reason, !answer.ok);
    } catch (err) {
      form.submit(); // no script path left: the plain form still works
    }
  }

  function wire(root) {
    root.querySelectorAll("form[data-confirm]").forEach((form) => {
      if (form.dataset.wired) return;
      form.dataset.wired = "1";
      form.addEventListener("submit", (ev) => {
        if (!window.confirm(form.dataset.confirm)) {
          ev.preventDefault();
          return;
        }
        if (form.hasAttribute("data-inplace")) {
          ev.preventDefault();
          postInPlace(form);
        }
      });
    });
    root.querySelectorAll("button[data-copy]").forEach((button) => {
      if (button.dataset.wired) return;
      button.dataset.wired = "1";
      button.addEventListener("click", async () => {
        const field = document.getElementById(button.dataset.copy);
        if (!field) return;
        field.select();
        try {
          await navigator.clipboard.writeText(field.value);
        } catch (err) {
          document.execCommand("copy");
        }
        button.textContent = "Copied";
        setTimeout(() => { button.textContent = "Copy"; }, 2000);
      });
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    wire(document);
    document.querySelectorAll("[data-live]").forEach(follow);
  });
})();
