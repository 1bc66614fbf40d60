// gpubroker pages: the only script. It follows a starting server's event
// stream (server-sent events from the REST API, authenticated by the
// session cookie) and moves the progress bar with readable messages.
// Every page works without it; it only saves a reload.
(function () {
  'use strict';
  var STEPS = ['pending', 'placing', 'creating', 'starting', 'running'];
  var LABELS = {
    pending: 'Waiting to start', placing: 'Finding room on a GPU', creating: 'Creating the notebook pod',
    starting: 'Starting the notebook', running: 'Running', stopping: 'Stopping', stopped: 'Stopped', failed: 'Failed'
  };

  // ORDER ranks the states of one spawn. The stream replays the spawn's
  // events from its start, so events ranked below the state the page was
  // rendered with are history and are skipped.
  var ORDER = { pending: 0, placing: 1, creating: 2, starting: 3, running: 4, stopping: 5, stopped: 6, failed: 7 };

  function follow(box) {
    var url = box.getAttribute('data-events');
    var spawn = box.getAttribute('data-spawn');
    var rendered = ORDER[box.getAttribute('data-state')] || 0;
    if (!url || !window.EventSource) { return; }
    var label = document.getElementById('state-label');
    var msg = document.getElementById('message');
    var bar = document.getElementById('progress');
    var step = document.getElementById('step');
    var es = new EventSource(url);
    es.addEventListener('state', function (e) {
      var ev;
      try { ev = JSON.parse(e.data); } catch (err) { return; }
      if (spawn && ev.spawnId !== spawn) { return; } // an older spawn's event
      if (!(ev.state in ORDER) || ORDER[ev.state] < rendered) { return; } // history
      if (label) { label.textContent = LABELS[ev.state] || ev.state; label.className = 'state state-' + ev.state; }
      if (msg) { msg.textContent = ev.message; }
      var i = STEPS.indexOf(ev.state);
      if (bar && i >= 0) { bar.value = i + 1; if (step) { step.textContent = String(i + 1); } }
      box.setAttribute('data-state', ev.state);
      if (ev.state === 'running') {
        if (box.getAttribute('data-enter') === 'true') {
          // A notebook's own page: the notebook answers at this address now.
          es.close();
          window.location.reload();
          return;
        }
        // Keep listening: a stop may follow.
        showOpen(box.getAttribute('data-server'));
      } else if (ev.state === 'stopped' || ev.state === 'failed') {
        es.close();
        window.location.reload(); // the page says it all, server-rendered
      }
    });
    es.addEventListener('error', function (e) {
      if (e.data) { // the API's own error event
        try { msg.textContent = JSON.parse(e.data).message; } catch (err) { /* keep the last message */ }
        es.close();
      }
      // Otherwise the connection dropped; EventSource reconnects with Last-Event-ID.
    });
  }

  // showOpen reads the server once more for its URL and reveals "Open".
  function showOpen(serverURL) {
    var open = document.getElementById('open');
    if (!open || !serverURL || !window.fetch) { return; }
    fetch(serverURL, { credentials: 'same-origin', headers: { Accept: 'application/json' } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (s) {
        if (s && s.openUrl) { open.href = s.openUrl; open.hidden = false; }
      })
      .catch(function () { /* the Open link appears on the next page load */ });
  }

  document.addEventListener('DOMContentLoaded', function () {
    var box = document.getElementById('status');
    if (box && box.hasAttribute('data-events')) { follow(box); }
    var summary = document.getElementById('error-summary') || document.getElementById('conflict') || document.getElementById('preview');
    if (summary) { summary.focus(); }
  });
})();
