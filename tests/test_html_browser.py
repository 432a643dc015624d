"""The --html pages opened in a real browser, headless Chromium (Debian's `chromium`; .ci/run
installs it): no console message (the page runs no script and fetches nothing: every host
name resolves to nothing), every chart in the DOM the browser built with every point of each
group (tests/test_html_page.py counts them in the file), and a screenshot that is not blank.
Skipped, saying why, only where no Chromium is installed."""
import shutil
import subprocess

import numpy as np
import pytest

from test_html_page import CHARTS, build_pages, expected_points, points_by_gid

BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")
                if shutil.which(b)), None)
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(BROWSER is None, reason="no Chromium installed (.ci/run "
                                 "installs Debian's: apt-get install chromium)")]


def browse(page, profile, *args) -> subprocess.CompletedProcess:
    """Chromium, headless, on `page` (a file), offline: every host name resolves to nothing;
    console messages logged to stderr (`:CONSOLE` lines)."""
    return subprocess.run(
        [BROWSER, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--no-first-run", "--enable-logging=stderr", "--v=0", f"--user-data-dir={profile}",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--window-size=1200,2400", *args,
         page.resolve().as_uri()],
        capture_output=True, text=True, timeout=180, check=True)


def console(run) -> list[str]:
    return [line for line in run.stderr.splitlines() if ":CONSOLE" in line]


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    folder = tmp_path_factory.mktemp("browser")
    return folder, build_pages(folder)


def test_the_browser_reports_console_messages(tmp_path):
    """The check below is no blind spot: a page that logs an error is seen to."""
    page = tmp_path / "noisy.html"
    page.write_text("<!DOCTYPE html><p>x</p><script>console.error('boom')</script>")
    assert any("boom" in line for line in console(browse(page, tmp_path / "p", "--dump-dom")))


@pytest.mark.parametrize("name", list(CHARTS))
def test_each_page_opens_offline_with_its_charts_and_points(pages, name, tmp_path):
    folder, paths = pages
    shot = tmp_path / f"{name}.png"
    run = browse(paths[name], tmp_path / "profile", "--dump-dom", f"--screenshot={shot}")
    assert console(run) == []  # no error, no failed fetch, no message at all
    svgs, points = points_by_gid(run.stdout)  # the DOM the browser built
    assert svgs == CHARTS[name]
    expected = {gid: n for gid, n in expected_points(folder).items() if gid.startswith(name)}
    assert expected and {gid: points.get(gid) for gid in expected} == expected
    import matplotlib.image  # deferred: the test extra's; only once a browser is there
    pixels = matplotlib.image.imread(shot)[..., :3].reshape(-1, 3)
    rgb = (pixels * 255).round().astype(np.uint32)
    colours = np.unique(rgb[:, 0] << 16 | rgb[:, 1] << 8 | rgb[:, 2])
    assert len(colours) > 1  # not blank: text, axes and points drawn
    assert (pixels < 0.9).any(axis=1).mean() > 0.01  # more than 1 % of the pixels inked
