from django.contrib.auth import views as auth_views
from django.urls import URLPattern, path

from portal import views

urlpatterns: list[URLPattern] = [
    # Customers and staff sign in here (LOGIN_URL); the admin keeps its own login for staff.
    path("accounts/login/", views.SignInView.as_view(), name="login"),
    # POST only (Django 5): a link or an image on another site cannot sign anyone out.
    path("accounts/logout/", auth_views.LogoutView.as_view(next_page="login"), name="logout"),
    path("", views.home, name="home"),
]
