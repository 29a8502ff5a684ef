/* Wrapped code lines keep their indentation (issue 10, item 8; see code-width.css). When a line of code is
   longer than the page is wide, its continuation should start under the line's own text, a little further in,
   not at the left margin, where it would read as a new, less indented line. CSS alone cannot see a line's
   indentation, so this puts each line of a code cell in its own box (class `code-line`), indented by the
   line's leading spaces + 4 characters with the first row pulled back. The text itself is unchanged:
   newlines stay between the boxes, so copying (and the copy button) gives exactly the original code.
   Without JavaScript, code-width.css's 4-character hanging indent applies instead. */
document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll(".bd-article div.cell_input pre").forEach((pre) => {
    if (pre.querySelector(":scope > .code-line")) return;
    // Pygments' markup is flat: text and <span class=token> children; a token may span several lines.
    const pieces = [];  // one array of nodes per line
    let line = [];
    for (const child of Array.from(pre.childNodes)) {
      const parts = child.textContent.split("\n");
      parts.forEach((part, i) => {
        if (i > 0) { pieces.push(line); line = []; }
        if (part === "") return;
        if (child.nodeType === Node.ELEMENT_NODE) {
          const span = child.cloneNode(false);
          span.textContent = part;
          line.push(span);
        } else {
          line.push(document.createTextNode(part));
        }
      });
    }
    pieces.push(line);
    if (pieces.length > 1 && pieces[pieces.length - 1].length === 0) pieces.pop();  // the final newline
    const text = pre.textContent;
    const out = document.createDocumentFragment();
    pieces.forEach((nodes, i) => {
      if (i > 0) out.appendChild(document.createTextNode("\n"));
      const box = document.createElement("span");
      box.className = "code-line";
      nodes.forEach((n) => box.appendChild(n));
      const indent = box.textContent.length - box.textContent.trimStart().length;
      box.style.setProperty("--indent", `${indent + 4}ch`);
      out.appendChild(box);
    });
    if (text.endsWith("\n")) out.appendChild(document.createTextNode("\n"));
    pre.replaceChildren(out);
    if (pre.textContent !== text) throw new Error("code-wrap.js changed the text of a code cell");
  });
});
