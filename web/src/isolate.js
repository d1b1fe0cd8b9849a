// Cross-origin isolation for static hosts that cannot send headers (GitHub Pages and the like).
//
// The wasm device runs on several threads only where the page is cross-origin isolated
// (crossOriginIsolated: SharedArrayBuffer for one WebAssembly.Memory shared by its workers).
// That takes two response headers, Cross-Origin-Opener-Policy: same-origin and
// Cross-Origin-Embedder-Policy: require-corp, which `tallow web serve` sends (web/serve.py) but a
// plain static host does not. This one file is both halves of the usual remedy:
//
// * loaded by index.html as a classic script (before the app), on a page that is not isolated it
//   registers itself as a service worker for the site's folder and, once that worker controls the
//   page, reloads the page once (a sessionStorage mark stops a second reload if isolation still
//   fails: the page then runs as before, on one thread);
// * as that service worker, it answers every same-origin request of the site from the network
//   with the two headers added, so the reloaded page, its module worker and their workers are
//   isolated. Other origins' requests are not touched (the site makes none).
//
// Nothing happens where the page is already isolated, where service workers are not available
// (an insecure origin, a private window that refuses them), or with ?isolate=0 in the URL.
/* global clients */
const HEADERS = { "Cross-Origin-Opener-Policy": "same-origin", "Cross-Origin-Embedder-Policy": "require-corp" };

if (typeof window === "undefined") {
  // ---- the service worker ----
  self.addEventListener("install", () => self.skipWaiting());
  self.addEventListener("activate", (event) => event.waitUntil(self.clients.claim()));
  self.addEventListener("fetch", (event) => {
    const request = event.request;
    if (new URL(request.url).origin !== self.location.origin) return; // the network as it is
    // Chrome throws on such requests (devtools' "only-if-cached" outside same-origin mode)
    if (request.cache === "only-if-cached" && request.mode !== "same-origin") return;
    event.respondWith(fetch(request).then((response) => {
      if (response.status === 0 || response.type === "opaqueredirect") return response;
      const headers = new Headers(response.headers);
      for (const [name, value] of Object.entries(HEADERS)) headers.set(name, value);
      return new Response(response.body, { status: response.status, statusText: response.statusText, headers });
    }));
  });
} else {
  // ---- the page ----
  (() => {
    const KEY = "tallow-isolate-reloaded";
    const off = new URL(location.href).searchParams.get("isolate") === "0";
    if (window.crossOriginIsolated) {
      sessionStorage.removeItem(KEY);
      return;
    }
    if (off || !window.isSecureContext || !("serviceWorker" in navigator)) return;
    const script = document.currentScript && document.currentScript.src;
    if (!script) return;
    const reloadOnce = () => {
      if (sessionStorage.getItem(KEY)) return; // reloaded already and still not isolated: run as is
      sessionStorage.setItem(KEY, "1");
      location.reload();
    };
    navigator.serviceWorker.register(script).then((registration) => {
      if (navigator.serviceWorker.controller) {
        // controlled, yet not isolated: the worker was installed before this page's headers
        // mattered (or an update is waiting); one reload brings the headers in
        reloadOnce();
        return;
      }
      navigator.serviceWorker.addEventListener("controllerchange", reloadOnce);
      // active from an earlier visit but not controlling this load (a hard reload bypasses it):
      // its activate event will not come again, so reload now (a normal reload is controlled)
      if (registration.active && registration.active.state === "activated") reloadOnce();
    }, (err) => console.warn(`tallow: no service worker for cross-origin isolation (${err.message}): one thread`));
  })();
}
