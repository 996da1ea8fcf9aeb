"""The assessment's admin page shows its status, every source revision, every report and the run."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from examples.suppliers import services
from examples.suppliers.models import SupplierAssessment
from tests.factories import Users, login

pytestmark = pytest.mark.django_db


def test_the_change_page_shows_status_revisions_reports_and_run(
    users: Users,
    assessment: SupplierAssessment,
) -> None:
    services.source_record_add(assessment_id=assessment.pk, source="sanctions", content={"hits": 7}, by=users.alice)
    services.report_generate(assessment_id=assessment.pk, revisions={"companies-house": 1, "sanctions": 2})
    services.assessment_submit_input(assessment_id=assessment.pk, by=users.alice, data={})
    run_id = SupplierAssessment.objects.get(pk=assessment.pk).run_id
    client = login(User.objects.create_superuser("root", "root@example.com", "pw"))

    page = client.get(reverse("admin:suppliers_supplierassessment_change", args=[assessment.pk]))
    assert page.status_code == 200
    html = page.content.decode()
    assert '<div class="readonly">Awaiting Input</div>' in html
    assert "{&quot;hits&quot;: 7}" in html  # revision 2's content
    assert reverse("admin:workflows_workflowrun_change", args=[run_id]) in html
    assert '<td class="field-revision"> <p>2</p>' in " ".join(html.split())  # both revisions listed
    assert "{&quot;sanctions&quot;: 2, &quot;companies-house&quot;: 1}" in html  # the report's revisions

    listing = client.get(reverse("admin:suppliers_supplierassessment_changelist"))
    assert listing.status_code == 200 and "Acme Metals" in listing.content.decode()


def test_outsiders_do_not_see_assessments(users: Users, assessment: SupplierAssessment) -> None:
    page = login(users.mallory).get(reverse("admin:suppliers_supplierassessment_change", args=[assessment.pk]))
    assert page.status_code == 302  # not staff: the admin sends them to its login page
