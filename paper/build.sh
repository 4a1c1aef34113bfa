#!/usr/bin/env bash
# Build the paper: regenerate tables and figures from benchmarks/results/*.json, refresh the
# generated blocks of paper/paper.md and docs/benchmarks.md (with README.md's headline table), and
# render HTML (and PDF) when pandoc is installed.
# Without pandoc, paper/paper.md with paper/generated/ is the paper.
#   bash paper/build.sh            (PYTHON=... to pick the interpreter)
set -euo pipefail
cd "$(dirname "$0")"
python=${PYTHON:-python3}
"$python" make_figures.py --out generated --splice paper.md
"$python" benchmarks_doc.py   # docs/benchmarks.md and README.md's headline table, from the same results
if ! command -v pandoc >/dev/null; then
  echo "pandoc not found: the paper is paper/paper.md (figures in paper/generated/)"
  exit 0
fi
mkdir -p build
pandoc paper.md --standalone --embed-resources --resource-path=. --toc -o build/paper.html
echo "wrote paper/build/paper.html"
for engine in tectonic xelatex pdflatex; do
  if command -v "$engine" >/dev/null; then
    pandoc paper.md --resource-path=. --pdf-engine="$engine" -V geometry:margin=2cm -o build/paper.pdf
    echo "wrote paper/build/paper.pdf"
    exit 0
  fi
done
echo "no LaTeX engine (tectonic, xelatex, pdflatex): skipped the PDF"
