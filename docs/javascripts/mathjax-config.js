// MathJax 3 for pymdownx.arithmatex (generic mode): typeset only the spans and blocks arithmatex marks.
// The script itself (assets/mathjax/tex-chtml.js) and its fonts are copied into the site at build time.
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
