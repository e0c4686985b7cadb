// MathJax 3 settings for pymdownx.arithmatex (generic mode): typeset only the spans/divs arithmatex
// marks, load nothing from the network (the library is copied into assets/mathjax/ at build time).
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex"
  }
};
