from pathlib import Path

from gateway.console.reports import report_links, report_title


def test_only_existing_reports_are_linked_by_their_place_in_the_list(tmp_path: Path) -> None:
    sim = tmp_path / "sim.html"
    sim.write_text("<html><head><title>Simulator report</title></head><body></body></html>")
    plain = tmp_path / "plain.html"
    plain.write_text("<p>no title</p>")
    links = report_links([tmp_path / "missing.html", sim, plain], "/console/reports")
    assert [(link.title, link.url) for link in links] == [
        ("Simulator report", "/console/reports/1/"),
        ("plain.html", "/console/reports/2/"),
    ]
    assert report_title(sim) == "Simulator report"
