// Weekly email preview: size the HTML part's frame to its content, so the whole email shows at the page's
// width with no clipped part and no scroll bar inside the frame. The frame is sandboxed without scripts
// (allow-same-origin only), so the email itself runs nothing; this page only reads its height.
(function () {
  "use strict";
  var frame = document.getElementById("email-html");
  if (!frame) return;
  function fit() {
    var doc = frame.contentDocument;
    if (!doc || !doc.documentElement) return;
    frame.style.height = doc.documentElement.scrollHeight + 24 + "px";
  }
  frame.addEventListener("load", fit);
  window.addEventListener("resize", fit);
  fit();
})();
