// The key dialog both pages share (index.html and compare.html hold its markup): asked for when the server
// answers 401, or from the "API key" button. The key goes to POST /v1/login and the field is emptied: a
// refused key keeps the dialog open with the server's reason; "Log out" ends the session (POST /v1/logout).

import {logIn, logOut, login} from "./api.js";

const $ = (id) => document.getElementById(id);

export function installLogin(onChange) {
  login.ask = () => new Promise((resolve, reject) => {
    const dialog = $("key-dialog");
    const error = $("key-error");
    const show = (message) => { error.hidden = !message; error.textContent = message || ""; };
    show("");
    $("key-input").value = "";
    const done = (ok) => {
      $("key-form").onsubmit = null;
      $("key-cancel").onclick = null;
      $("key-logout").onclick = null;
      dialog.close();
      ok ? resolve() : reject(new Error("An API key is needed to read this server's traces."));
    };
    $("key-form").onsubmit = async (e) => {
      e.preventDefault();
      const value = $("key-input").value.trim();
      $("key-input").value = "";
      const refused = await logIn(value);
      if (refused) show(`That key was refused: ${refused}`);
      else done(true);
    };
    $("key-logout").onclick = async () => {
      await logOut();
      done(false);
      onChange();
    };
    $("key-cancel").onclick = () => done(false);
    dialog.oncancel = (e) => { e.preventDefault(); done(false); };
    dialog.showModal();
    $("key-input").focus();
  });
  $("key-button").addEventListener("click", () => login.ask().then(onChange, () => {}));
}
