// gpubroker pages: the only script. A server's page follows the server's
// event stream (server-sent events from the REST API, authenticated by the
// session cookie) and, on every event, fetches its own main content again
// from the server, rendered by the same template as a full load
// (X-Gpubroker-Fragment: main): the live page always equals a fresh load of
// its URL, whatever the state. Every page works without it; it only saves
// a reload.
(function () {
  'use strict';

  // REFRESH_MS re-renders a live page now and then even without an event,
  // so times and the idle state stay current.
  var REFRESH_MS = 30000;

  // changed reports whether the user changed a form field from what the
  // page rendered.
  function changed(el) {
    switch (el.tagName) {
      case 'INPUT':
        if (el.type === 'checkbox' || el.type === 'radio') { return el.checked !== el.defaultChecked; }
        return el.type !== 'hidden' && el.type !== 'submit' && el.type !== 'button' && el.value !== el.defaultValue;
      case 'TEXTAREA':
        return el.value !== el.defaultValue;
      case 'SELECT':
        for (var i = 0; i < el.options.length; i++) {
          if (el.options[i].selected !== el.options[i].defaultSelected) { return true; }
        }
    }
    return false;
  }

  // keptForms returns the forms of main the user is working in (one holds
  // the focus or has unsent changes, or shows problems): an update keeps
  // them as they are.
  function keptForms(main) {
    var kept = {};
    var forms = main.querySelectorAll('form[id]');
    for (var i = 0; i < forms.length; i++) {
      var f = forms[i];
      var busy = f.contains(document.activeElement) || f.querySelector('[aria-invalid="true"], .alert') !== null;
      for (var j = 0; !busy && j < f.elements.length; j++) {
        busy = changed(f.elements[j]);
      }
      if (busy) { kept[f.id] = f; }
    }
    return kept;
  }

  function follow(box) {
    var url = box.getAttribute('data-events');
    var page = box.getAttribute('data-page');
    var enter = box.getAttribute('data-enter') === 'true'; // a notebook's page (notebook.html)
    var main = document.querySelector('main');
    if (!url || !main || !window.EventSource) { return; }
    if (!enter && (!page || !window.fetch)) { return; }
    var es = new EventSource(url);
    var timer = null;
    var inFlight = false;
    var again = false;

    function stop() {
      es.close();
      if (timer) { clearInterval(timer); }
    }

    // refresh fetches the page's main content and swaps it in; events that
    // arrive meanwhile cause one more fetch after it, never a pile.
    function refresh() {
      if (inFlight) { again = true; return; }
      inFlight = true;
      fetch(page, { credentials: 'same-origin', headers: { 'X-Gpubroker-Fragment': 'main' } })
        .then(function (r) { return r.ok ? r.text() : null; })
        .then(function (html) {
          if (html === null) { return; }
          var kept = keptForms(main);
          main.innerHTML = html;
          Object.keys(kept).forEach(function (id) {
            var fresh = document.getElementById(id);
            if (fresh) { fresh.parentNode.replaceChild(kept[id], fresh); }
          });
          var now = document.getElementById('status');
          if (!now || !now.hasAttribute('data-events')) { stop(); } // stopped or failed: nothing follows
        })
        .catch(function () { /* the next event or tick tries again */ })
        .then(function () {
          inFlight = false;
          if (again) { again = false; refresh(); }
        });
    }

    // The stream replays the server's retained events first; those up to
    // the record's last change are already on the page.
    var shown = Number(box.getAttribute('data-updated')) || 0;
    es.addEventListener('state', function (e) {
      var ev;
      try { ev = JSON.parse(e.data); } catch (err) { ev = null; }
      var at = ev && Date.parse(ev.time);
      if (at && at <= shown) { return; }
      if (enter) {
        // A notebook's own page: load it again, so that it shows the start
        // as it is now, or, once the server runs, the notebook itself.
        stop();
        window.location.reload();
        return;
      }
      refresh();
    });
    es.addEventListener('error', function (e) {
      if (e.data) { // the API's own error event: the stream ended; show the page as it is
        if (enter) { stop(); return; } // a reload could meet the same end again
        refresh();
      }
      // Otherwise the connection dropped; EventSource reconnects with Last-Event-ID.
    });
    if (!enter) { timer = setInterval(refresh, REFRESH_MS); }
  }

  document.addEventListener('DOMContentLoaded', function () {
    var box = document.getElementById('status');
    if (box && box.hasAttribute('data-events')) { follow(box); }
    var summary = document.getElementById('error-summary') || document.getElementById('conflict') ||
      document.getElementById('preview') || document.getElementById('confirm');
    var invalid = document.querySelector('main [aria-invalid="true"]');
    if (summary) { summary.focus(); } else if (invalid && invalid.focus) { invalid.focus(); }
  });
})();
