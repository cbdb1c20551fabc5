"""The documentation's relative links: every file they name exists, and every #anchor is a heading
of that file (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens)."""

import os
import re
import subprocess

from conftest import REPO

LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def headings(path: str) -> set:
    with open(path, encoding="utf-8") as f:
        return {anchor(line.lstrip("#")) for line in f if line.startswith("#")}


def test_relative_links_and_anchors_resolve():
    pages = subprocess.run(["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    broken = []
    for page in pages:
        with open(os.path.join(REPO, page), encoding="utf-8") as f:
            links = LINK.findall(f.read())
        for link in links:
            if re.match(r"[a-z]+:", link):  # https:, mailto:
                continue
            path, _, fragment = link.partition("#")
            target = os.path.normpath(os.path.join(REPO, os.path.dirname(page), path)) if path else \
                os.path.join(REPO, page)
            if not os.path.exists(target):
                broken.append(f"{page}: {link} (no such file)")
            elif fragment and target.endswith(".md") and fragment not in headings(target):
                broken.append(f"{page}: {link} (no such heading)")
    assert pages and not broken, "\n".join(broken)
