/* API docs (Redoc): keep the page fully local. Redoc's side-menu footer draws a logo from cdn.redoc.ly,
 * which the CSP blocks anyway; point every off-origin <img> at our own favicon before the request is made.
 * Loaded before the Redoc bundle; no inline script (the CSP forbids it). */
(function () {
  "use strict";
  var logo = (document.currentScript && document.currentScript.getAttribute("data-logo")) || "";
  var setAttribute = Element.prototype.setAttribute;
  function offOrigin(value) {
    try { return new URL(String(value), document.baseURI).origin !== window.location.origin; }
    catch (e) { return true; }
  }
  Element.prototype.setAttribute = function (name, value) {
    if (this.tagName === "IMG" && String(name).toLowerCase() === "src" && offOrigin(value)) {
      value = logo;
    }
    return setAttribute.call(this, name, value);
  };
  // React may set the property instead of the attribute.
  var src = Object.getOwnPropertyDescriptor(HTMLImageElement.prototype, "src");
  if (src && src.set) {
    Object.defineProperty(HTMLImageElement.prototype, "src", {
      configurable: true,
      enumerable: src.enumerable,
      get: src.get,
      set: function (value) { src.set.call(this, offOrigin(value) ? logo : value); }
    });
  }
}());
